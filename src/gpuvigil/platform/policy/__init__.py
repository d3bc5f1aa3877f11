"""The remediation policy: a pure state machine per node. No I/O, no clock.

    decide(node, fleet=..., now=..., config=...) -> Decision

The controller (`platform.controller`) calls it for every node on every pass, with the node
as its adapter read it (`NodeView`: health summary, stored record, blocks, running work,
agent result, preflight) and what the safety layer allows (`Fleet`). It returns the record
to store on the node and the idempotent operations that make the cluster match it; the
controller stores the record first and then applies the operations, so a controller killed
between the two redoes the same operations (same request id) on its next pass.

States and edges (docs/controller.md has the diagram and the reasons):
HEALTHY -> SUSPECT (new work blocked) on a FAILED finding -> DRAINING when it persists past
`suspect_grace_s` or at once when fatal -> REMEDIATING one ladder step (RESET_GPU, REBOOT,
REPLACE), escalating when the step fails or the problem returns -> VALIDATING (a preflight
pass newer than the step, and a fresh healthy summary) -> HEALTHY. QUARANTINED for
INVESTIGATE findings, after `max_failed_steps`, or when validation could not read the node;
only `release()` (`gpuvigil release NODE`) leaves it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from gpuvigil.core.findings import Action
from gpuvigil.platform.policy.values import (
    Assessment,
    Decision,
    Fleet,
    Op,
    OpKind,
    PolicyConfig,
    assess,
)
from gpuvigil.platform.state import LADDER, NodeView, Record, State

__all__ = [
    "Assessment",
    "Decision",
    "Fleet",
    "Op",
    "OpKind",
    "PolicyConfig",
    "assess",
    "decide",
    "release",
]


def _next_step(after: Action | None, wanted: Action) -> Action | None:
    """The ladder step to take: at least `wanted`, and past `after` when a step was tried."""
    floor = wanted if wanted in LADDER else LADDER[0]
    if after is not None:
        i = LADDER.index(after) + 1 if after in LADDER else 0
        if i >= len(LADDER):
            return None
        floor = max(floor, LADDER[i], key=lambda a: a.rank)
    return floor


def _timeout(step: Action | None, config: PolicyConfig) -> float:
    if step is Action.RESET_GPU:
        return config.reset_timeout_s
    if step is Action.REBOOT:
        return config.reboot_timeout_s
    return config.replace_timeout_s


def _age(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since is not None else 0.0


def _request_id(node: str, step: Action, now: datetime) -> str:
    return f"{node}.{step.value.lower()}.{int(now.timestamp())}"


class _Ctx:
    """Small helper so each state handler reads as its rule."""

    def __init__(self, node: NodeView, fleet: Fleet, now: datetime, config: PolicyConfig) -> None:
        self.node, self.fleet, self.now, self.cfg = node, fleet, now, config
        self.rec = node.record or Record()
        # The breaker's tool cause is honoured where a block is all it could cause (HEALTHY,
        # SUSPECT); a node being repaired or validated stays strict (fail closed).
        tolerate = self.rec.state in (State.HEALTHY, State.SUSPECT)
        held = fleet.tolerated_checks if tolerate else frozenset()
        self.a = assess(node, now=now, config=config, tolerated=held)

    def tolerated(self) -> str:
        """Why findings on the node are not acted on (the breaker's tool cause), or ""."""
        checks = sorted({p.check for p in self.a.tolerated})
        if not checks:
            return ""
        return f"circuit breaker: check {', '.join(checks)} fails closed fleet-wide (tool breakage)"

    def keep(self, reason: str = "", *ops: Op, held: str = "") -> Decision:
        block = () if self.node.blocked_by_us else (Op(OpKind.BLOCK),)
        return Decision(self.rec, (*block, *ops), reason or self.rec.reason, held=held)

    def go(
        self, to: State, reason: str, *ops: Op, disruptive: bool = False, **kw: object
    ) -> Decision:
        rec = self.rec.moved(
            to, at=self.now, reason=reason, code=self.a.code or self.rec.code, **kw
        )
        block: tuple[Op, ...] = ()
        if to.blocks and not self.node.blocked_by_us:
            block = (Op(OpKind.BLOCK),)
        if to is State.VALIDATING:
            ops = (*ops, *self.revalidate(rec))
        return Decision(rec, (*block, *ops), reason, store=True, disruptive=disruptive)

    def revalidate(self, rec: Record) -> tuple[Op, ...]:
        """Run preflight again for this validation, unless a run for it is under way (the
        record says so) or the cluster has no preflight channel (Slurm: a fresh clean
        summary ends the validation). Every validation gets its own run (a new node's
        first one included): no pass from before `since` counts."""
        if not self.node.preflight_supported or rec.preflight_for == rec.since:
            return ()
        return (Op(OpKind.REVALIDATE),)

    def drain_or_hold(self, reason: str) -> Decision:
        """Start draining if safety allows; otherwise stay SUSPECT (blocked) and say why."""
        if not self.a.readable:  # unknown data never triggers a disruption
            return self.suspect(reason)
        cooldown_left = self.cfg.cooldown_s - _age(self.rec.last_action_at, self.now)
        held = self.fleet.why_not if not self.fleet.may_disrupt else ""
        if self.rec.last_action_at is not None and cooldown_left > 0:
            held = f"cooldown ({cooldown_left:.0f} s left)"
        if held:
            d = self.suspect(reason)
            return Decision(d.record, d.ops, d.reason, store=d.store, held=held)
        return self.go(
            State.DRAINING,
            reason,
            self._drain_op(self.now),
            disruptive=True,
            last_action_at=self.now,
            fatal=self.a.fatal or self.rec.fatal,
        )

    def suspect(self, reason: str) -> Decision:
        if self.rec.state is State.SUSPECT:
            return self.keep()
        return self.go(State.SUSPECT, reason)

    def _drain_op(self, since: datetime) -> Op:
        return Op(OpKind.DRAIN, deadline=since + timedelta(seconds=self.cfg.drain_timeout_s))

    def start_step(self, step: Action | None, reason: str, **kw: object) -> Decision:
        if step is None or self.rec.failures >= self.cfg.max_failed_steps:
            why = (
                f"{reason}; {self.rec.failures} failed steps" if step else f"{reason}; ladder ended"
            )
            return self.go(State.QUARANTINED, why)
        rid = _request_id(self.node.name, step, self.now)
        kind = OpKind.REPLACE if step is Action.REPLACE else OpKind.REQUEST
        op = Op(kind, action=step, request_id=rid, gpus=self.a.gpus)
        return self.go(
            State.REMEDIATING,
            f"{step.value}: {reason}",
            op,
            step=step,
            request_id=rid,
            boot_id=self.node.boot_id,
            last_action_at=self.now,
            **kw,
        )

    def fail_step(self, reason: str) -> Decision:
        if self.fleet.breaker_holds:  # the next step is a new disruption: a fleet event
            if self.a.readable and not self.a.real:  # e.g. the bad driver was rolled back
                # validate afresh: a preflight from before the rollback does not count
                why = f"{reason}; the problem cleared: validating"
                return self.go(State.VALIDATING, why, since=self.now)
            return self.keep(f"{reason}; next step held", held=self.fleet.why_not)
        failures = self.rec.failures + 1
        self.rec = self.rec.model_copy(update={"failures": failures})
        if failures >= self.cfg.max_failed_steps:
            return self.go(State.QUARANTINED, f"{reason}; {failures} failed steps")
        return self.start_step(_next_step(self.rec.step, self.a.action), reason)


def decide(
    node: NodeView,
    *,
    fleet: Fleet | None = None,
    now: datetime,
    config: PolicyConfig | None = None,
) -> Decision:
    """The next record and operations for `node`; see the module docstring."""
    c = _Ctx(node, fleet or Fleet(), now, config or PolicyConfig())
    handler = _HANDLERS[c.rec.state]
    return handler(c)


def _healthy(c: _Ctx) -> Decision:
    a, node = c.a, c.node
    if node.record is None and node.unvalidated:  # a new node: preflight runs before work
        return c.go(State.VALIDATING, "new node: waiting for preflight")
    if node.blocked_by_someone_else and not c.cfg.act_on_foreign_blocked:
        who = ", ".join(node.blocked_by_others)
        unblock = (Op(OpKind.UNBLOCK),) if node.blocked_by_us else ()  # ours only
        return Decision(c.rec, unblock, f"blocked by someone else ({who}): left alone")
    if not a.readable:
        seen_once = node.health is not None or node.health_error == "unreadable"
        if c.cfg.block_unknown and not c.fleet.breaker_open and seen_once:
            return c.go(State.SUSPECT, f"unknown: {a.unknown_reason}")
        unblock = (Op(OpKind.UNBLOCK),) if node.blocked_by_us else ()
        return Decision(c.rec, unblock, f"not acted on: {a.unknown_reason}")
    if a.problems:
        # A new episode; a problem back soon after a step continues the same ladder.
        recent = _age(c.rec.last_step_done_at, now=c.now) <= c.cfg.escalation_window_s
        if c.rec.last_step_done_at is not None and recent and a.real:
            c.rec = c.rec.model_copy(update={"failures": c.rec.failures + 1})
            if c.rec.failures >= c.cfg.max_failed_steps:
                return c.go(State.QUARANTINED, f"{a.describe()} returned after {c.rec.step}")
        elif not recent or c.rec.last_step_done_at is None:
            c.rec = c.rec.model_copy(update={"failures": 0, "step": None})
        if a.action is Action.INVESTIGATE:
            return c.go(State.QUARANTINED, f"needs a human: {a.describe()}")
        if a.fatal:
            return c.drain_or_hold(f"fatal: {a.describe()}")
        return c.go(State.SUSPECT, a.describe())
    unblock = (Op(OpKind.UNBLOCK),) if node.blocked_by_us or node.unvalidated else ()
    return Decision(c.rec, unblock, c.tolerated() or "healthy")


def _suspect(c: _Ctx) -> Decision:
    a = c.a
    stuck = _age(c.rec.since, c.now) >= c.cfg.suspect_max_s
    if not a.readable:
        if stuck:
            return c.go(
                State.QUARANTINED, f"unknown for {c.cfg.suspect_max_s:.0f} s: {a.unknown_reason}"
            )
        return c.keep(f"unknown: {a.unknown_reason}")
    if not a.problems:
        why = c.tolerated()
        return c.go(State.HEALTHY, f"block lifted: {why}" if why else "problem cleared",
                    Op(OpKind.UNBLOCK))  # fmt: skip
    if a.action is Action.INVESTIGATE:
        return c.go(State.QUARANTINED, f"needs a human: {a.describe()}")
    persisted = _age(c.rec.since, c.now) >= c.cfg.suspect_grace_s
    if a.fatal or (persisted and a.action.rank >= Action.RESET_GPU.rank):
        return c.drain_or_hold(("fatal: " if a.fatal else "persisted: ") + a.describe())
    if stuck:  # nothing automatic repairs it (a check that cannot run, a RESTART_APP finding)
        return c.go(
            State.QUARANTINED, f"unresolved for {c.cfg.suspect_max_s:.0f} s: {a.describe()}"
        )
    return c.keep(a.describe())


def _draining(c: _Ctx) -> Decision:
    if c.node.running > 0:
        return c.keep("", c._drain_op(c.rec.since or c.now))
    a = c.a
    if a.readable and not a.problems and not c.rec.fatal:
        return c.go(State.VALIDATING, "drained; the problem cleared: validating")
    return c.start_step(_next_step(c.rec.step, a.action), f"drained; {a.describe()}")


def _remediating(c: _Ctx) -> Decision:
    rec, node = c.rec, c.node
    step = rec.step or Action.RESET_GPU
    res = node.agent_result
    if step is not Action.REPLACE and res is not None and res.request_id == rec.request_id:
        if not res.succeeded:
            return c.fail_step(f"{step.value} failed: {res.detail}".rstrip(": "))
        if step is Action.REBOOT and rec.boot_id and node.boot_id == rec.boot_id:
            return c.keep("reboot reported but the boot id did not change yet")
        return c.go(State.VALIDATING, f"{step.value} done: validating", last_step_done_at=c.now)
    if _age(rec.since, c.now) >= _timeout(step, c.cfg):
        if step is Action.REPLACE:
            return c.go(State.QUARANTINED, "replacement requested but the node is still here")
        return c.fail_step(f"{step.value} timed out")
    if rec.issued == rec.request_id:
        return c.keep(f"waiting for {step.value}")
    kind = OpKind.REPLACE if step is Action.REPLACE else OpKind.REQUEST
    return c.keep("", Op(kind, action=step, request_id=rec.request_id, gpus=c.a.gpus))


def _validating(c: _Ctx) -> Decision:
    rec, node, a = c.rec, c.node, c.a
    since = rec.since or c.now
    pf = node.preflight
    fresh_pf = pf is not None and pf.at >= since
    if a.readable and a.real:
        why = f"{a.describe()} after {rec.step.value}" if rec.step else a.describe()
        if a.action is Action.INVESTIGATE:
            return c.go(State.QUARANTINED, f"needs a human: {why}")
        if rec.step is None and a.action.rank < Action.RESET_GPU.rank:
            return c.keep(f"validation blocked: {why}")
        if not rec.in_budget:  # a new or released node: its first step takes budget
            if not c.fleet.may_disrupt:
                return c.keep(f"validation failed: {why}", held=c.fleet.why_not)
            d = c.fail_step(f"validation failed: {why}")
            return replace(d, disruptive=d.record.in_budget)
        return c.fail_step(f"validation failed: {why}")
    if fresh_pf and pf is not None and not pf.passed:
        return c.fail_step(f"preflight failed: {pf.summary}".rstrip(": "))
    healthy_now = a.readable and not a.problems and node.heartbeat_at is not None
    passed = (fresh_pf and pf is not None and pf.passed) or (
        not node.preflight_supported and healthy_now and node.heartbeat_at >= since  # type: ignore[operator]
    )
    if passed and healthy_now:
        done = {"failures": rec.failures, "last_step_done_at": rec.last_step_done_at or c.now}
        return c.go(State.HEALTHY, "validated", Op(OpKind.UNBLOCK), **done)
    if _age(since, c.now) >= c.cfg.validation_timeout_s:
        if not a.readable:  # never escalate on data we could not read: ask a human
            return c.go(State.QUARANTINED, f"validation timed out; {a.unknown_reason}")
        return c.fail_step("validation timed out")
    if fresh_pf:
        return c.keep("waiting for a healthy summary")
    return c.keep("waiting for preflight", *c.revalidate(rec))


def _quarantined(c: _Ctx) -> Decision:
    return c.keep()


_HANDLERS = {
    State.HEALTHY: _healthy,
    State.SUSPECT: _suspect,
    State.DRAINING: _draining,
    State.REMEDIATING: _remediating,
    State.VALIDATING: _validating,
    State.QUARANTINED: _quarantined,
}


def release(record: Record | None, *, now: datetime, who: str = "a human") -> Record:
    """`gpuvigil release NODE`: end a quarantine; the node validates before taking work."""
    rec = record or Record()
    return rec.moved(
        State.VALIDATING,
        at=now,
        reason=f"released by {who}",
        failures=0,
        step=None,
        last_step_done_at=None,
        request_id="",
    )
