"""The controller's side of the capacity gate: before a disruptive step (a node drain, a
per-GPU eviction, a GPU reset or a reboot) ask `platform.capacity` for every serving pool,
and carry out its answer: scale up, hold with the `HeldForCapacity` node condition, audit a
bypass; after the step, restore the replicas. Also says what a drain did past a
PodDisruptionBudget (refused evictions; pods deleted at the deadline although a budget
refused them): an Event, a metric and an event-log line (the lab's timeline).

Called by `platform.apply` (`allow`, `drained`) and by `platform.controller` (`begin`,
`restore`, `export`). Needs a cluster adapter with `serving` (Kubernetes); the controller
refuses serving pools on any other. A pool that cannot be read holds the step (fail closed).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gpuvigil.core.events import Kind
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.announce import Announcer
from gpuvigil.platform.capacity import (
    Judgement,
    Step,
    StepKind,
    Verdict,
    combine,
    judge,
    restore_due,
)
from gpuvigil.platform.clusters.base import ClusterError, DrainStatus, Fenced, NodeView
from gpuvigil.platform.metrics import ControllerMetrics
from gpuvigil.platform.policy import Op, OpKind
from gpuvigil.platform.serving_pool import ServingConfig
from gpuvigil.platform.state import State

log = logging.getLogger("gpuvigil.controller")
WAITING = "WaitingForReplicas"  # the condition's reason during make-before-break


def _problems(node: NodeView) -> list[FindingSummary]:
    return [f for f in (node.health.findings if node.health else []) if f.status is not Status.OK]


def _bypass(problems: list[FindingSummary], codes: Iterable[str]) -> str:
    wanted = set(codes)
    return next((f.code for f in problems if f.code in wanted), "")


def step_for(node: NodeView, op: Op, *, bypass_codes: Iterable[str]) -> Step | None:
    """The gate's view of a node op on `node`; None for ops that disrupt nothing."""
    problems = _problems(node)
    faulty = frozenset(f.component for f in problems if f.component.startswith("gpu:"))
    bypass = _bypass(problems, bypass_codes)
    if op.kind is OpKind.DRAIN:
        return Step(StepKind.DRAIN, node.name, faulty=faulty, bypass=bypass)
    if op.kind is OpKind.REQUEST and op.action is Action.RESET_GPU:
        gpus = frozenset(f"gpu:{i}" for i in op.gpus) or None
        return Step(StepKind.RESET_GPU, node.name, faulty=faulty, removes=gpus, bypass=bypass)
    if op.kind is OpKind.REQUEST and op.action is Action.REBOOT:
        return Step(StepKind.REBOOT, node.name, faulty=faulty, bypass=bypass)
    return None


def gpu_step(node: NodeView, kind: StepKind, uuid: str, *, bypass_codes: Iterable[str]) -> Step:
    """One GPU's step (`platform.gpu_path`: the eviction of its holders, its reset): the
    GPU, by UUID, is both the faulty device and the one removed."""
    one = frozenset({uuid})
    return Step(kind, node.name, faulty=one, removes=one,
                bypass=_bypass(_problems(node), bypass_codes))  # fmt: skip


class ServingGuard:
    def __init__(
        self,
        cluster: Any,
        config: ServingConfig,
        *,
        voice: Announcer,
        metrics: ControllerMetrics | None,
        dry_run: bool = False,
    ) -> None:
        self.cluster, self.config, self.voice = cluster, config, voice
        self.metrics, self.dry_run = metrics, dry_run
        self._lock = threading.Lock()
        self._held: Counter[tuple[str, str]] = Counter()  # (pool, reason) -> nodes, this pass
        self._escalated: Counter[str] = Counter()
        self._shown: set[tuple[str, str]] = set()

    @property
    def active(self) -> bool:
        return bool(self.config.pools)

    def begin(self) -> None:
        with self._lock:
            self._held.clear()
            self._escalated.clear()

    def allow(self, node: NodeView, op: Op, *, now: datetime) -> bool:
        """May `op` go ahead on `node` now? False: skipped this pass (the decision is kept,
        so the next pass asks again). Fenced propagates; other API errors hold."""
        step = step_for(node, op, bypass_codes=self.config.bypass_codes)
        if step is None or not self.active:
            return True
        return self.allow_step(node, step, what=op.kind.value, now=now)

    def allow_step(self, node: NodeView, step: Step, *, what: str, now: datetime) -> bool:
        """`allow` for a step built by the caller (`gpu_step`); `what` names it."""
        if not self.active:
            return True
        serving = self.cluster.serving
        try:
            held_since = serving.held_since(node.name)
            nodes = serving.nodes()
            js = [
                judge(
                    p,
                    serving.state(p, step, now=now, nodes=nodes),
                    step,
                    now=now,
                    held_since=held_since,
                )
                for p in self.config.pools
            ]
        except Fenced:
            raise
        except ClusterError as e:
            self.voice.api_error(e)
            self._hold(node.name, "*", "PoolUnreadable", f"serving pools unreadable: {e}", now)
            return False
        j = combine(js)
        assert j is not None
        self._count(j)
        if j.verdict is Verdict.BYPASS:
            self._audit(node.name, what, j, now)
            self._clear(node.name, held_since)
            return True
        if j.verdict is Verdict.PROCEED:
            self._clear(node.name, held_since)
            return True
        if j.verdict is Verdict.SCALE_UP and not self.dry_run:
            pool = next(p for p in self.config.pools if p.name == j.pool)
            state = serving.state(pool, step, now=now, nodes=nodes)
            serving.scale_up(
                pool, to=j.scale_to, added=j.added, node=node.name, state=state, now=now
            )
            msg = f"pool {j.pool}: {j.reason}: replicas {state.desired} -> {j.scale_to}"
            self.voice.event(
                node.name, Kind.REMEDIATION, now, action="CAPACITY", result="scale-up", reason=msg
            )
            self.voice.cluster_event(node.name, "ServingScaleUp", msg, False)
        reason = j.hold.value if j.verdict is Verdict.HOLD else WAITING
        self._hold(
            node.name, j.pool, reason, f"pool {j.pool}: {j.reason}", now, escalate=j.escalate
        )
        return False

    def _count(self, j: Judgement) -> None:
        if self.metrics is not None:
            self.metrics.capacity_gate.labels(j.pool, j.verdict.value).inc()

    def _audit(self, node: str, what: str, j: Judgement, now: datetime) -> None:
        msg = f"{what}: {j.reason} (pool {j.pool}: H={j.healthy}, L={j.removed})"
        log.warning("node %s: %s", node, msg)
        self.voice.event(
            node,
            Kind.REMEDIATION,
            now,
            action="CAPACITY",
            result="bypassed",
            reason=msg,
            audit=True,
        )
        self.voice.cluster_event(node, "CapacityGateBypassed", msg, True)

    def _hold(
        self,
        node: str,
        pool: str,
        reason: str,
        message: str,
        now: datetime,
        *,
        escalate: bool = False,
    ) -> None:
        with self._lock:
            self._held[(pool, reason)] += 1
            if escalate:
                self._escalated[pool] += 1
        self.voice.say(node, f"held: capacity: {message}", now)
        if escalate:
            self.voice.cluster_event(node, "CapacityHoldEscalated", message, True)
        if not self.dry_run:
            try:
                self.cluster.serving.set_held(node, reason=reason, message=message, now=now)
            except Fenced:
                raise
            except ClusterError as e:  # the hold stands without its condition
                self.voice.api_error(e)

    def _clear(self, node: str, held_since: datetime | None) -> None:
        if held_since is None or self.dry_run:
            return
        try:
            self.cluster.serving.set_held(node, reason="", message="", now=None)
        except Fenced:
            raise
        except ClusterError as e:
            self.voice.api_error(e)

    def restore(
        self, nodes: list[NodeView], *, now: datetime, after: dict[str, State] | None = None
    ) -> None:
        """Put back what a make-before-break added, once its node's disruption is over.
        `after`: the states this pass decided, which `nodes` (read before it) do not know:
        a node whose drain this pass began is disrupted, though its view says SUSPECT
        (the lab saw a scale-up restored in the pass that made it, and made again)."""
        if not self.active or self.dry_run:
            return
        states = {n.name: n.record.state for n in nodes if n.record is not None} | (after or {})
        active = {name for name, state in states.items() if state.disruptive}
        serving = self.cluster.serving
        for pool in self.config.pools:
            if pool.workload is None:
                continue
            try:
                mark = serving.mark(pool)
                if mark is None:
                    continue
                state = serving.state(
                    pool, Step(StepKind.DRAIN, mark.node), now=now, nodes=serving.nodes()
                )
                if not restore_due(pool, state, now=now, step_active=mark.node in active):
                    continue
                to = serving.restore(pool, state)
            except Fenced:
                raise
            except ClusterError as e:
                self.voice.api_error(e)
                continue
            msg = f"pool {pool.name}: replicas restored to {to} after the repair of {mark.node}"
            self.voice.event(
                mark.node, Kind.REMEDIATION, now, action="CAPACITY", result="restored", reason=msg
            )
            self.voice.cluster_event(mark.node, "ServingRestored", msg, False)

    def drained(self, node: NodeView, st: DrainStatus, *, now: datetime) -> None:
        """What a drain pass did against PodDisruptionBudgets, said where people look."""
        m = self.metrics
        if st.blocked and m is not None:
            m.evictions_refused.labels(node.pool).inc(st.blocked)
        if st.blocked:
            self.voice.say(
                node.name,
                f"drain: {st.blocked} evictions refused by a PodDisruptionBudget; retried",
                now,
            )
        if st.past_budget:
            if m is not None:
                m.pdb_overridden.labels(node.pool).inc(len(st.past_budget))
            msg = (
                f"{len(st.past_budget)} pods deleted at the drain deadline although a "
                f"PodDisruptionBudget refused their eviction: {', '.join(st.past_budget[:10])}"
            )
            log.warning("node %s: %s", node.name, msg)
            self.voice.event(
                node.name,
                Kind.REMEDIATION,
                now,
                action="DRAIN",
                result="pdb-overridden",
                reason=msg,
                pods=list(st.past_budget),
            )
            self.voice.cluster_event(node.name, "DisruptionBudgetOverridden", msg, True)

    def export(self) -> None:
        m = self.metrics
        if m is None or not self.active:
            return
        with self._lock:
            now = dict(self._held)
            esc = dict(self._escalated)
        for key in self._shown - set(now):
            m.capacity_held.labels(*key).set(0)
        for key, n in now.items():
            m.capacity_held.labels(*key).set(n)
        self._shown |= set(now)
        for pool in {p.name for p in self.config.pools}:
            m.capacity_escalated.labels(pool).set(esc.get(pool, 0))
