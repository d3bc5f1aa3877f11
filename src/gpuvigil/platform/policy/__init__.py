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
`suspect_grace_s` (a hung check too), or `fatal_grace_s` after a fatal one -> REMEDIATING
one ladder step (RESET_GPU, REBOOT, REPLACE; a hung check stops at REBOOT), escalating when
the step fails or the problem returns -> VALIDATING (a preflight pass newer than the step,
and a fresh healthy summary; after REPLACE, only once another machine stands behind the
node) -> HEALTHY. QUARANTINED for INVESTIGATE findings (`fatal_grace_s` after they were
first seen, blocked meanwhile), after `max_failed_steps` or a spent
ladder; only `release()` (`gpuvigil release NODE`) leaves it, and its work is moved off
(drained, the node stays quarantined) while a finding slows it (`slowing_codes`) and an
idle node of its pool can take the work (`Fleet.room`). Staleness alone blocks new
work and never more: no drain, no step, no quarantine. What the circuit breaker holds
(`Fleet.held`, `Fleet.stale`) neither starts nor escalates a repair; a held finding blocks
unless it is a check that could not run (`hold_blocks`).
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
from gpuvigil.platform.state import (
    EPISODE_LIMIT,
    LADDER,
    Episode,
    NodeView,
    Record,
    State,
    episode_start,
)

__all__ = [
    "NEEDS_HUMAN",
    "PROBE_FAILED",
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


UNKNOWN = "unknown: "  # reason prefix of a block set because the node could not be read
RELEASED = "released by "  # reason prefix of the validation that follows a release
# reason prefix of a SUSPECT node that is due a quarantine the quarantine rate holds back
QUEUED = "waiting to quarantine: "
# reason prefix of a breaker probe whose capped ladder did not cure it: the cause is the
# change, not this machine, which goes back to being held (never quarantined for it)
PROBE_FAILED = "probe did not cure it: "
NEEDS_HUMAN = "needs a human: "  # reason prefix of an INVESTIGATE finding's block and quarantine


def _next_step(after: Action | None, wanted: Action, cap: Action | None = None) -> Action | None:
    """The ladder step to take: at least `wanted`, past `after` when a step was tried, and
    not beyond `cap` (None when the ladder is spent)."""
    floor = wanted if wanted in LADDER else LADDER[0]
    if after is not None:
        i = LADDER.index(after) + 1 if after in LADDER else 0
        if i >= len(LADDER):
            return None
        floor = max(floor, LADDER[i], key=lambda a: a.rank)
    if cap is not None and floor.rank > cap.rank:
        return None
    return floor


def _timeout(step: Action | None, config: PolicyConfig) -> float:
    if step is Action.RESET_GPU:
        return config.reset_timeout_s
    if step is Action.REBOOT:
        return config.reboot_timeout_s
    return config.replace_timeout_s


def state_deadline(record: Record, config: PolicyConfig) -> datetime | None:
    """The latest the policy itself ends the record's state (its timeout: the step fails or
    the drain removes what is left); None for states without one. Past it (and a pass or
    two), remediation is stuck: gpuvigil_node_state_deadline_timestamp_seconds pages."""
    if record.since is None:
        return None
    if record.state is State.DRAINING:
        limit = config.drain_timeout_s
    elif record.state is State.REMEDIATING:
        limit = _timeout(record.step, config)
    elif record.state is State.VALIDATING:
        limit = config.validation_timeout_s
    else:
        return None
    return record.since + timedelta(seconds=limit)


def _age(since: datetime | None, now: datetime) -> float:
    return (now - since).total_seconds() if since is not None else 0.0


def _request_id(node: str, step: Action, now: datetime) -> str:
    return f"{node}.{step.value.lower()}.{int(now.timestamp())}"


def _new_machine(node: NodeView, rec: Record) -> bool:
    """Another machine stands behind the node than when the replacement was asked for: a
    new provider id where both are known, else a new boot id."""
    if node.provider_id and rec.provider_id:
        return node.provider_id != rec.provider_id
    return bool(node.boot_id and rec.boot_id and node.boot_id != rec.boot_id)


class _Ctx:
    """Small helper so each state handler reads as its rule."""

    def __init__(self, node: NodeView, fleet: Fleet, now: datetime, config: PolicyConfig) -> None:
        self.node, self.fleet, self.now, self.cfg = node, fleet, now, config
        self.rec = node.record or Record()
        pid = node.provider_id
        other = bool(pid and self.rec.machine and self.rec.machine != pid)  # a new machine
        renamed = bool(fleet.history and not self.rec.episodes)  # its machine's past
        if other or renamed:
            self.rec = self.rec.model_copy(update={"machine": pid, "episodes": fleet.history})
        self.a = assess(node, now=now, config=config, held=fleet.held)

    # ---- the machine's memory ----------------------------------------------------------

    def past(self, window_s: float) -> list[Episode]:
        return [e for e in self.rec.episodes if _age(e.end, self.now) <= window_s]

    @property
    def lemon(self) -> str:
        """Why this machine is a lemon ("" when it is not): this episode and the past
        ones within `lemon_window_s` reach `lemon_episodes`."""
        n = len(self.past(self.cfg.lemon_window_s)) + 1
        if n < self.cfg.lemon_episodes:
            return ""
        return f"lemon: {n} episodes within {self.cfg.lemon_window_s:.0f} s"

    @property
    def flapping(self) -> str:
        """Why this episode's finding counts as persistent ("" when not): it came back
        `flap_count` times within `flap_window_s`."""
        code = self.rec.code or self.a.code
        n = 1 + sum(code in e.codes for e in self.past(self.cfg.flap_window_s))
        if not code or n < self.cfg.flap_count:
            return ""
        return f"flapping: {code} back {n} times within {self.cfg.flap_window_s:.0f} s"

    def useless(self) -> set[Action]:
        """Steps tried in `useless_step_after` past episodes that never cured this machine.
        One GPU's episodes (`Episode.gpu`) reset that GPU alone: they say nothing of a
        node-wide step."""
        out = set()
        node_eps = [e for e in self.rec.episodes if not e.gpu]
        for step in LADDER:
            tried = sum(step in e.steps for e in node_eps)
            cured = any(e.outcome == f"cured:{step.value}" for e in node_eps)
            if tried >= self.cfg.useless_step_after and not cured:
                out.add(step)
        return out

    def _episode_end(self, to: State) -> dict[str, object]:
        """The record fields a transition to `to` changes in the machine's memory: a new
        episode starts its steps afresh; one that ends (validated, cleared, quarantined)
        is appended to the history."""
        was = self.rec.state
        update: dict[str, object] = {}
        if was is State.HEALTHY and to is not State.HEALTHY:
            update["tried"] = ()
        ends = to in (State.HEALTHY, State.QUARANTINED) and was is not to
        if not ends or self.rec.reason.startswith(RELEASED):  # a release's validation
            return update
        tried = () if was is State.HEALTHY else self.rec.tried
        if to is State.QUARANTINED:
            outcome = "quarantined"
        else:
            outcome = f"cured:{tried[-1].value}" if tried else "cleared"
        start = episode_start(self.rec) or self.now
        codes = tuple(sorted({self.rec.code, self.a.code} - {""}))
        ep = Episode(start=start, end=self.now, codes=codes, steps=tried, outcome=outcome)
        update["episodes"] = (*self.rec.episodes, ep)[-EPISODE_LIMIT:]
        update["machine"] = self.node.provider_id or self.rec.machine
        return update

    @property
    def cap(self) -> Action | None:
        """The highest ladder step allowed: a hung check alone stops at REBOOT, as does a
        breaker probe."""
        caps = [c for c in (self.a.max_step, self.fleet.max_step) if c is not None]
        return min(caps, key=lambda a: a.rank) if caps else None

    @property
    def held_only(self) -> bool:
        """The breaker holds what is wrong with this node, and nothing else is."""
        return bool(self.a.held) and self.a.readable and not self.a.repairable

    @property
    def held_blocked(self) -> bool:
        """Held, yet blocked: a fatal or INVESTIGATE held finding always blocks (the breaker
        holds remediation, never detection), and any held one under the strict setting."""
        return self.held_only and (self.a.held_severe or not self.fleet.hold_blocks)

    @property
    def stale(self) -> bool:
        """Unreadable in a pool the breaker found silent: the monitoring's failure."""
        return not self.a.readable and bool(self.fleet.stale)

    def held_reason(self) -> str:
        return self.fleet.held_reason if self.a.held else ""

    def keep(self, reason: str = "", *ops: Op, held: str = "") -> Decision:
        block = () if self.node.blocked_by_us else (Op(OpKind.BLOCK),)
        return Decision(self.rec, (*block, *ops), reason or self.rec.reason, held=held)

    def go(
        self, to: State, reason: str, *ops: Op, disruptive: bool = False, **kw: object
    ) -> Decision:
        if to is State.QUARANTINED and not self.fleet.may_quarantine:
            # the costliest action, rate-limited fleet-wide: wait blocked for a slot
            why = reason.removeprefix(QUEUED)
            if self.rec.state is State.SUSPECT and self.rec.reason.startswith(QUEUED):
                return self.keep(held=self.fleet.quarantine_why)
            d = self.go(State.SUSPECT, f"{QUEUED}{why}")
            return replace(d, held=self.fleet.quarantine_why)
        memory = self._episode_end(to)
        rec = self.rec.moved(
            to, at=self.now, reason=reason, code=self.a.code or self.rec.code, **memory, **kw
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

    def disruption_held(self) -> str:
        """Why safety holds a new disruption of this node now ("" when it may start): the
        pool's budget or the fleet's rate, or this node's own cooldown."""
        cooldown_left = self.cfg.cooldown_s - _age(self.rec.last_action_at, self.now)
        if self.rec.last_action_at is not None and cooldown_left > 0:
            return f"cooldown ({cooldown_left:.0f} s left)"
        return self.fleet.why_not if not self.fleet.may_disrupt else ""

    def drain_or_hold(self, reason: str) -> Decision:
        """Start draining if safety allows; otherwise stay SUSPECT (blocked) and say why."""
        if not self.a.readable:  # unknown data never triggers a disruption
            return self.suspect(reason)
        held = self.disruption_held()
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
        if step is None and self.fleet.max_step is not None and not self.a.max_step:
            return self.go(State.SUSPECT, f"{PROBE_FAILED}{reason}", failures=0)
        if self.cap is None and self.lemon:  # whatever the ladder says: a new machine
            step, reason = Action.REPLACE, f"{reason}; {self.lemon}"
        else:
            if step is not None and self.cap is None:
                skip = self.useless()
                while step in skip and step is not Action.REPLACE:
                    reason = f"{reason}; {step.value} skipped (never cured this machine)"
                    step = LADDER[LADDER.index(step) + 1]
            if step is None or self.rec.failures >= self.cfg.max_failed_steps:
                why = f"{reason}; {self.rec.failures} failed steps" if step else (
                    f"{reason}; ladder ended")  # fmt: skip
                return self.go(State.QUARANTINED, why)
        if step is Action.REPLACE and not self.node.replace_supported:
            return self.go(State.QUARANTINED, f"{reason}; nothing can replace this machine "
                           "(no replace hook): a person swaps it")  # fmt: skip
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
            provider_id=self.node.provider_id,
            last_action_at=self.now,
            tried=(*self.rec.tried, step),
            **kw,
        )

    def fail_step(self, reason: str) -> Decision:
        if self.stale:  # no news is not a failed step: wait for the reports to return
            return self.keep(f"{reason}; waiting for reports", held=self.fleet.stale)
        if not self.a.readable:  # never escalate on data we could not read
            return self.keep(f"{reason}; waiting for a readable summary")
        if self.held_only:  # what fails is the breaker's cause, not this machine
            return self.keep(f"{reason}; next step held", held=self.fleet.held_reason)
        if self.fleet.breaker_open and not self.a.problems and not self.a.held:
            # e.g. the bad driver was rolled back meanwhile: validate afresh (a preflight
            # from before the rollback does not count)
            return self.go(State.VALIDATING, f"{reason}; the problem cleared: validating",
                           since=self.now)  # fmt: skip
        failures = self.rec.failures + 1
        self.rec = self.rec.model_copy(update={"failures": failures})
        if failures >= self.cfg.max_failed_steps:
            return self.go(State.QUARANTINED, f"{reason}; {failures} failed steps")
        return self.start_step(_next_step(self.rec.step, self.a.action, self.cap), reason)


def decide(
    node: NodeView,
    *,
    fleet: Fleet | None = None,
    now: datetime,
    config: PolicyConfig | None = None,
) -> Decision:
    """The next record and operations for `node`; see the module docstring."""
    c = _Ctx(node, fleet or Fleet(), now, config or PolicyConfig())
    d = replace(_HANDLERS[c.rec.state](c), findings=c.a.problems)
    if d.record.hold != c.fleet.hold_mark:  # remembered on the node, so a restart holds it
        rec = d.record.model_copy(update={"hold": c.fleet.hold_mark})
        d = replace(d, record=rec, store=True)
    return d


def _healthy(c: _Ctx) -> Decision:
    a, node = c.a, c.node
    if node.record is None and c.fleet.returned:  # given back, and the same machine is here
        return c.go(State.QUARANTINED, c.fleet.returned)
    if node.record is None and (node.unvalidated or c.fleet.replaces):
        # a new node (a replacement even without the taint): preflight runs before work
        why = f"replaces {c.fleet.replaces}: " if c.fleet.replaces else "new node: "
        return c.go(State.VALIDATING, f"{why}waiting for preflight", replaces=c.fleet.replaces)
    if node.blocked_by_someone_else and not c.cfg.act_on_foreign_blocked:
        who = ", ".join(node.blocked_by_others)
        unblock = (Op(OpKind.UNBLOCK),) if node.blocked_by_us else ()  # ours only
        return Decision(c.rec, unblock, f"blocked by someone else ({who}): left alone")
    if not a.readable:
        seen_once = node.health is not None or node.health_error == "unreadable"
        if c.cfg.block_unknown and seen_once and not c.stale:
            return c.go(State.SUSPECT, f"{UNKNOWN}{a.unknown_reason}")
        unblock = (Op(OpKind.UNBLOCK),) if node.blocked_by_us else ()
        why = f"{a.unknown_reason}; {c.fleet.stale}" if c.stale else a.unknown_reason
        return Decision(c.rec, unblock, f"not acted on: {why}", held=c.fleet.stale)
    if a.problems:
        # A new episode; a problem back soon after a step continues the same ladder.
        recent = _age(c.rec.last_step_done_at, now=c.now) <= c.cfg.escalation_window_s
        if c.rec.last_step_done_at is not None and recent and a.repairable:
            c.rec = c.rec.model_copy(update={"failures": c.rec.failures + 1})
            if c.rec.failures >= c.cfg.max_failed_steps:
                return c.go(State.QUARANTINED, f"{a.describe()} returned after {c.rec.step}")
        elif not recent or c.rec.last_step_done_at is None:
            c.rec = c.rec.model_copy(update={"failures": 0, "step": None})
        if a.action is Action.INVESTIGATE and c.cfg.fatal_grace_s <= 0:
            return c.go(State.QUARANTINED, f"{NEEDS_HUMAN}{a.describe()}")
        if a.action is Action.INVESTIGATE:  # blocked now; quarantined after the grace
            return c.go(State.SUSPECT, f"{NEEDS_HUMAN}{a.describe()}")
        if a.fatal and c.cfg.fatal_grace_s <= 0:
            return c.drain_or_hold(f"fatal: {a.describe()}")
        return c.go(State.SUSPECT, ("fatal: " if a.fatal else "") + a.describe())
    if c.held_blocked:  # blocked, never acted on: a disruption the breaker holds
        return replace(c.go(State.SUSPECT, c.fleet.held_reason), held=c.fleet.held_reason)
    unblock = (Op(OpKind.UNBLOCK),) if node.blocked_by_us or node.unvalidated else ()
    return Decision(c.rec, unblock, c.held_reason() or "healthy", held=c.held_reason())


def _suspect(c: _Ctx) -> Decision:
    a = c.a
    stuck = _age(c.rec.since, c.now) >= c.cfg.suspect_max_s
    if not a.readable:
        if c.stale and c.rec.reason.startswith(UNKNOWN):  # blocked for staleness alone
            return c.go(State.HEALTHY, f"block lifted: {c.fleet.stale}", Op(OpKind.UNBLOCK))
        # Staleness never quarantines: a dead agent is not a dead GPU, and the block heals
        # by itself when the reports return.
        return c.keep(f"{UNKNOWN}{a.unknown_reason}", held=c.fleet.stale)
    if c.rec.reason.startswith(QUEUED) and a.problems:  # held: the breaker's, not this one
        return c.go(State.QUARANTINED, c.rec.reason)  # its slot, or wait on
    if not a.problems:
        if c.held_blocked:
            return c.keep(c.fleet.held_reason, held=c.fleet.held_reason)
        if c.flapping:  # back too often to trust its absence: the block stays, repair it
            return c.drain_or_hold(c.flapping)
        why = c.held_reason()
        return c.go(State.HEALTHY, f"block lifted: {why}" if why else "problem cleared",
                    Op(OpKind.UNBLOCK))  # fmt: skip
    age = _age(c.rec.since, c.now)
    if a.action is Action.INVESTIGATE:
        # the costliest action waits `fatal_grace_s`, blocked, as a drain does: a new Xid
        # reaching one node every 30 s is a burst the breaker holds, not N quarantines
        if age >= c.cfg.fatal_grace_s:
            return c.go(State.QUARANTINED, f"{NEEDS_HUMAN}{a.describe()}")
        return c.keep(f"{NEEDS_HUMAN}{a.describe()}")
    fatal = a.fatal and age >= c.cfg.fatal_grace_s
    persisted = age >= c.cfg.suspect_grace_s and a.action.rank >= Action.RESET_GPU.rank
    if fatal or persisted:
        return c.drain_or_hold(("fatal: " if a.fatal else "persisted: ") + a.describe())
    if stuck and not a.repairable:  # nothing automatic repairs it (a check that cannot run)
        return c.go(
            State.QUARANTINED, f"unresolved for {c.cfg.suspect_max_s:.0f} s: {a.describe()}"
        )
    return c.keep(a.describe())


def _draining(c: _Ctx) -> Decision:
    if c.node.running > 0:
        return c.keep("", c._drain_op(c.rec.since or c.now))
    a = c.a
    if c.stale:  # no step on a node nobody can read in a silent pool: wait for reports
        return c.keep(f"drained; waiting for reports ({a.unknown_reason})", held=c.fleet.stale)
    if c.held_blocked:  # what is left is held and still blocks: wait blocked, off budget
        return replace(
            c.go(State.SUSPECT, f"drained; {c.fleet.held_reason}"), held=c.fleet.held_reason
        )
    if a.readable and not a.problems and c.flapping:  # persistent though absent right now
        return c.start_step(_next_step(c.rec.step, Action.RESET_GPU, c.cap),
                            f"drained; {c.flapping}")  # fmt: skip
    if a.readable and not a.problems and (not c.rec.fatal or a.held):
        # the problem cleared, or what is left is the breaker's cause: validate, no step
        why = f"; {c.fleet.held_reason}" if a.held else ""
        return c.go(State.VALIDATING, f"drained; the problem cleared: validating{why}")
    return c.start_step(_next_step(c.rec.step, a.action, c.cap), f"drained; {a.describe()}")


def _remediating(c: _Ctx) -> Decision:
    rec, node = c.rec, c.node
    step = rec.step or Action.RESET_GPU
    res = node.agent_result
    if step is Action.REPLACE:
        if _new_machine(node, rec):  # it counts once the new machine passes preflight
            return c.go(State.VALIDATING, "a new machine joined: validating",
                        last_step_done_at=c.now)  # fmt: skip
    elif res is not None and res.request_id == rec.request_id:
        if not res.succeeded:
            return c.fail_step(f"{step.value} failed: {res.detail}".rstrip(": "))
        if step is Action.REBOOT and rec.boot_id and node.boot_id == rec.boot_id:
            return c.keep("reboot reported but the boot id did not change yet")
        return c.go(State.VALIDATING, f"{step.value} done: validating", last_step_done_at=c.now)
    if _age(rec.since, c.now) >= _timeout(step, c.cfg):
        if step is Action.REPLACE:
            return c.go(State.QUARANTINED, "replacement requested but the same machine is "
                        "still here")  # fmt: skip
        return c.fail_step(f"{step.value} timed out")
    if rec.issued == rec.request_id:
        return c.keep(f"waiting for {step.value}")
    kind = OpKind.REPLACE if step is Action.REPLACE else OpKind.REQUEST
    return c.keep("", Op(kind, action=step, request_id=rec.request_id, gpus=c.a.gpus))


def _validating(c: _Ctx) -> Decision:
    rec, node, a = c.rec, c.node, c.a
    since = rec.since or c.now
    pf = node.preflight
    # This validation's own run, or one that finished after it began. By identity first:
    # a run a skewed leader started for this `since` is redated by the next leader to when
    # it saw it (`platform.observed`), which can lie before a `since` written 20 s ahead.
    fresh_pf = pf is not None and (pf.for_since == since or pf.at >= since)
    if a.readable and a.repairable:
        why = f"{a.describe()} after {rec.step.value}" if rec.step else a.describe()
        if a.action is Action.INVESTIGATE:
            return c.go(State.QUARANTINED, f"{NEEDS_HUMAN}{why}")
        if rec.step is None and a.action.rank < Action.RESET_GPU.rank:
            return c.keep(f"validation blocked: {why}")
        if not rec.in_budget:  # a new or released node: its first step takes budget
            if not c.fleet.may_disrupt:
                return c.keep(f"validation failed: {why}", held=c.fleet.why_not)
            d = c.fail_step(f"validation failed: {why}")
            return replace(d, disruptive=d.record.in_budget)
        return c.fail_step(f"validation failed: {why}")
    if c.held_blocked:  # a held fatal finding never validates: wait blocked, off budget
        return c.go(State.SUSPECT, f"validation held: {c.fleet.held_reason}")
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
        if not a.readable:  # never escalate on data we could not read; never quarantine
            return c.keep(f"validation waits for a readable summary ({a.unknown_reason})",
                          held=c.fleet.stale)  # fmt: skip
        return c.fail_step("validation timed out")
    if fresh_pf:
        return c.keep("waiting for a healthy summary")
    return c.keep("waiting for preflight", *c.revalidate(rec))


def _quarantined(c: _Ctx) -> Decision:
    """Blocked, for a person. One thing is automatic: work left on a node whose finding
    slows it (`slowing_codes`: a throttled GPU) is moved off once an idle node of the pool
    can take it, since a gang job runs at its slowest node's speed for as long as the
    quarantine lasts. The node stays QUARANTINED; its record's `last_action_at` marks the
    move as started, so it takes the budget's slot and a rate token once."""
    rec, slow = c.rec, c.a.slowing(c.cfg.slowing_codes) if c.a.readable else ()
    if not slow or c.node.running <= 0:
        return c.keep()
    started = rec.last_action_at is not None and rec.since is not None and (
        rec.last_action_at >= rec.since)  # fmt: skip
    what = ", ".join(f"{p.code} {p.component}" for p in slow[:3])
    if started:  # the drain goes on (the same idempotent operation) until the work is gone
        return c.keep(f"moving its work off: {what}", c._drain_op(rec.last_action_at))
    held = c.disruption_held() or ("" if c.fleet.room else (
        f"no idle node in pool {c.node.pool} to take its work"))  # fmt: skip
    if held:
        return c.keep(held=held)
    moved = rec.model_copy(update={"last_action_at": c.now})
    block = () if c.node.blocked_by_us else (Op(OpKind.BLOCK),)
    why = f"moving its work off: {what} slows it (a gang runs at its slowest node's speed)"
    return Decision(moved, (*block, c._drain_op(c.now)), why, store=True, disruptive=True)


_HANDLERS = {
    State.HEALTHY: _healthy,
    State.SUSPECT: _suspect,
    State.DRAINING: _draining,
    State.REMEDIATING: _remediating,
    State.VALIDATING: _validating,
    State.QUARANTINED: _quarantined,
}


def release(record: Record | None, *, now: datetime, who: str = "a human") -> Record:
    """`gpuvigil release NODE`: end a quarantine; the node validates before taking work.
    The machine's memory is kept (its episodes, the last one marked with who released
    it): a lemon released again and again is still a lemon."""
    rec = record or Record()
    episodes = rec.episodes
    if episodes and episodes[-1].outcome == "quarantined" and not episodes[-1].released_by:
        episodes = (*episodes[:-1], episodes[-1].model_copy(update={"released_by": who}))
    return rec.moved(
        State.VALIDATING,
        at=now,
        reason=f"{RELEASED}{who}",
        episodes=episodes,
        failures=0,
        step=None,
        last_step_done_at=None,
        request_id="",
    )
