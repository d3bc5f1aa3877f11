"""The remediation controller's reconcile loop (`gpuvigil controller`). Settings: `controller:`.

Level-based: every pass lists the nodes, reads each one's stored record and health summary
from the cluster, asks the pure policy (`platform.policy.decide`) what the node should be,
and makes it so. Nothing is remembered between passes that matters for correctness (only
the breaker's hysteresis and which events were already said), so a killed controller
resumes exactly where the records on the nodes say it was. Per node, the record is stored
before the operations it implies; the operations are idempotent (blocks, drains, requests
with a fixed id), so a pass repeated after a crash never repeats a step.

Called by `commands/controller.py` (the loop), by the tests and the benchmark (one
`reconcile()` at a time against `clusters.memory`), and by the simulator.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.core.findings import Action, utcnow
from gpuvigil.core.states import REMOVED
from gpuvigil.platform.breaker import Breaker, Change
from gpuvigil.platform.clusters.base import (
    Cluster,
    ClusterError,
    Conflict,
    NodeView,
    Unavailable,
)
from gpuvigil.platform.clusters.settings import KubernetesSettings, SlurmSettings
from gpuvigil.platform.metrics import ControllerMetrics
from gpuvigil.platform.policy import Decision, OpKind, PolicyConfig, decide
from gpuvigil.platform.replacements import Replacements
from gpuvigil.platform.safety import Gate, SafetyConfig, excluded, pool_of
from gpuvigil.platform.state import Record, State

log = logging.getLogger("gpuvigil.controller")


class ControllerConfig(StrictModel):
    """`controller:` in the config file. Every field and default: docs/controller.md."""

    cluster: Literal["kubernetes", "slurm"] = "kubernetes"
    interval_s: float = Field(10.0, gt=0)  # between reconcile passes
    apply_workers: int = Field(8, ge=1)  # nodes acted on at once (bounded by the adapter)
    dry_run: bool = False  # decide and record (events, metrics, log), never act
    events_path: Path | None = None  # JSONL event log (core.events); None: none written
    metrics_port: int = Field(9403, ge=0, le=65535)  # 0: no metrics endpoint
    leader_election: bool = True  # Kubernetes: one active replica through a Lease
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    safety: SafetyConfig = Field(default_factory=SafetyConfig)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)


@dataclass
class PassResult:
    """What one reconcile pass did (for tests, the benchmark and the simulator)."""

    at: datetime
    decisions: dict[str, Decision] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    listed: bool = True
    breaker_open: bool = False


class Controller:
    def __init__(
        self,
        cluster: Cluster,
        *,
        config: ControllerConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        metrics: ControllerMetrics | None = None,
        events: EventWriter | None = None,
        identity: str = "controller",
    ) -> None:
        self.cluster = cluster
        self.config = config or ControllerConfig()
        self.clock = clock
        self.metrics = metrics
        self.events = events
        self.identity = identity
        policy, safety = self.config.policy, self.config.safety
        self.breaker = Breaker(safety, heartbeat_stale_s=policy.heartbeat_stale_s)
        self.replacements = Replacements(timeout_s=policy.replace_timeout_s)
        self._signatures: set[tuple[str, str, str]] = set()  # exported signature series
        self._said: dict[str, str] = {}  # node -> last held/left-alone message (no spam)
        self._shown: dict[str, State] = {}  # node -> state exported in gpuvigil_node_state
        self._announced: set[str] = set()  # nodes whose state this process has put on record
        self.last_pass_at = time.time()  # wall clock of the last finished pass (/healthz)

    # ---- one pass -------------------------------------------------------------------

    def reconcile(self) -> PassResult:
        started = time.perf_counter()
        now = self.clock()
        result = PassResult(at=now)
        try:
            nodes = self.cluster.list_nodes()
        except ClusterError as e:  # act on nothing we could not read
            self._api_error(e)
            log.warning("cannot list nodes: %s", e)
            result.listed = False
            return result
        self._announce(nodes, now)
        for change in self.breaker.update(nodes, now=now):
            self._breaker_changed(change, now)
        result.breaker_open = self.breaker.status.open
        safety = self.config.safety
        for gone in self.replacements.observe(nodes, now=now, pool_of=lambda v: pool_of(v, safety)):
            log.warning("node %s was given back for replacement at %s and no new machine "
                        "joined pool %s since", gone.node, gone.at, gone.pool)  # fmt: skip
        gate = Gate(safety, nodes, now=now, breaker=self.breaker, replacements=self.replacements)
        held = 0
        work: list[tuple[NodeView, Decision, Any]] = []
        for node in nodes:
            if excluded(node, self.config.safety):
                self._say(node.name, "excluded by label: observed, never acted on", now)
                continue
            fleet = gate.fleet_for(node)
            d = decide(node, fleet=fleet, now=now, config=self.config.policy)
            result.decisions[node.name] = d
            if d.disruptive:
                gate.consume(node)
            elif node.record and node.record.in_budget and not d.record.in_budget:
                gate.release(node)
            if d.held:
                held += 1
                self._say(node.name, f"held: {d.held}", now)
            if d.store or d.ops:
                work.append((node, d, fleet))
        # Decisions are made in order (the budget is consumed in order); applying them is
        # independent per node, so an adapter that allows it does it concurrently.
        workers = min(self.config.apply_workers, getattr(self.cluster, "max_concurrency", 1))
        if workers > 1 and len(work) > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="apply") as pool:
                list(pool.map(lambda w: self._apply_one(*w, now, result), work))
        else:
            for w in work:
                self._apply_one(*w, now, result)
        self._export(nodes, result, gate, held, started)
        self.last_pass_at = time.time()
        return result

    def _apply_one(
        self, node: NodeView, d: Decision, fleet: Any, now: datetime, result: PassResult
    ) -> None:
        try:
            try:
                self._apply(node, d, now)
            except Conflict:  # changed since the list (a heartbeat): re-read, decide again
                fresh = self.cluster.get_node(node.name)
                again = decide(fresh, fleet=fleet, now=now, config=self.config.policy)
                if again.disruptive and not d.disruptive:
                    return  # its budget was not counted in this pass: the next pass decides
                result.decisions[node.name] = again
                self._apply(fresh, again, now)
        except ClusterError as e:
            self._api_error(e)
            result.errors[node.name] = f"{e.kind}: {e}"
            log.info("node %s: %s (%s); next pass retries", node.name, e, e.kind)

    def _apply(self, node: NodeView, d: Decision, now: datetime) -> None:
        old = node.record or Record()
        if self.config.dry_run:
            if d.store:
                self._transition(node, old, d, now)
            return
        if d.store:
            self.cluster.store(node.name, d.record, version=node.version)
            self._transition(node, old, d, now)  # said once: only after the store held
        rec = d.record
        for op in d.ops:
            if op.kind is OpKind.BLOCK:
                self.cluster.block(node.name, reason=rec.tag())
            elif op.kind is OpKind.UNBLOCK:
                self.cluster.unblock(node.name)
            elif op.kind is OpKind.DRAIN:
                assert op.deadline is not None
                st = self.cluster.drain(node.name, deadline=op.deadline, reason=rec.reason)
                if st.forced:
                    self._event(
                        node.name,
                        Kind.REMEDIATION,
                        now,
                        action="DRAIN",
                        result="forced",
                        reason=f"{st.forced} left at the deadline",
                    )
            elif op.kind is OpKind.REPLACE:
                # At most once: remember it first (a replacement is not idempotent when it is
                # a hook); a crash right here leaves a timeout and a quarantine, not a repeat.
                self.cluster.store(node.name, rec.model_copy(update={"issued": op.request_id}))
                pool = pool_of(node, self.config.safety)
                self.replacements.given_back(node, pool=pool, now=now)
                self.cluster.replace(node.name, reason=rec.reason)
                if getattr(self.cluster, "replace_removes_node", False):
                    # The node object is gone with its record: say so, so that layer 4 stops
                    # counting a machine that left the fleet (its successor joins anew).
                    self._event(node.name, Kind.NODE_STATE, now, **{
                        "from": rec.state.value, "to": REMOVED, "reason": "replaced: node "
                        "deleted", "dry_run": False})  # fmt: skip
                    self._announced.discard(node.name)  # a successor of that name is new
            elif op.kind is OpKind.REVALIDATE:
                # At least once: revalidate deletes only preflight pods older than `since`,
                # so a repeat after a crash here never kills the fresh run.
                assert rec.since is not None
                self.cluster.revalidate(node.name, since=rec.since)
                self.cluster.store(node.name, rec.model_copy(update={"preflight_for": rec.since}))
            elif op.kind is OpKind.REQUEST:
                assert op.action is not None
                self.cluster.request(
                    node.name, action=op.action, request_id=op.request_id, gpus=list(op.gpus)
                )
                # At least once: the agent acts once per id, so a resend after a crash is safe.
                self.cluster.store(node.name, rec.model_copy(update={"issued": op.request_id}))

    # ---- what it says about itself ---------------------------------------------------

    def _transition(self, node: NodeView, old: Record, d: Decision, now: datetime) -> None:
        new = d.record
        if new.state is not old.state:
            verb = "would move" if self.config.dry_run else "moved"
            msg = f"{verb} {old.state.value} -> {new.state.value}: {d.reason}"
            log.info("node %s: %s", node.name, msg)
            self._event(
                node.name,
                Kind.NODE_STATE,
                now,
                **{
                    "from": old.state.value,
                    "to": new.state.value,
                    "reason": d.reason,
                    "dry_run": self.config.dry_run,
                },
            )
            if not self.config.dry_run:
                warn = new.state in (State.QUARANTINED, State.DRAINING, State.REMEDIATING)
                self._cluster_event(node.name, f"gpuvigil{new.state.value.title()}", msg, warn)
        for action, res in _remediation_results(old, new):
            if self.metrics:
                self.metrics.remediations.labels(action, res).inc()
            self._event(
                node.name, Kind.REMEDIATION, now, action=action, result=res, reason=d.reason
            )

    def _announce(self, nodes: list[NodeView], now: datetime) -> None:
        """One `node.state` event (`from: null`) per node the first time this process sees
        it, so availability counts nodes that never change state, and a restarted
        controller's log stands on its own."""
        for node in nodes:
            if node.name in self._announced:
                continue
            self._announced.add(node.name)
            state = (node.record or Record()).state
            self._event(
                node.name,
                Kind.NODE_STATE,
                now,
                **{
                    "from": None,
                    "to": state.value,
                    "reason": "observed",
                    "dry_run": self.config.dry_run,
                },
            )

    def _say(self, name: str, message: str, now: datetime) -> None:
        if self._said.get(name) == message:
            return
        self._said[name] = message
        log.info("node %s: %s", name, message)
        self._event(name, Kind.REMEDIATION, now, action="NONE", result="skipped", reason=message)

    def _event(self, node: str, kind: Kind, now: datetime, **data: object) -> None:
        if self.events is not None:
            self.events.write(
                Event(
                    ts=now.timestamp(), kind=kind.value, source="controller", node=node, data=data
                )
            )

    def _cluster_event(self, node: str, reason: str, message: str, warning: bool) -> None:
        try:
            self.cluster.record_event(node, reason=reason, message=message, warning=warning)
        except ClusterError as e:  # an event is not worth failing a transition for
            self._api_error(e)

    def _breaker_changed(self, change: Change, now: datetime) -> None:
        """A cause opened or closed: a warning, a `breaker` event naming the suspected
        change, and the trip counter."""
        log.warning("circuit breaker %s (%s): %s", change.state, change.cause, change.reason)
        if self.events is not None:
            data = {"state": change.state, "reason": change.reason, "causes": [change.cause]}
            self.events.write(
                Event(
                    ts=now.timestamp(),
                    kind=Kind.BREAKER.value,
                    source="controller",
                    data={**data, **change.detail},
                )
            )
        if self.metrics and change.state == "open":
            self.metrics.breaker_trips.inc()
        sig = self.breaker.signatures.get(change.cause)
        if change.state == "open" and sig is not None and not self.config.dry_run:
            # a cluster event people see (`kubectl get events`), on the burst's first node
            self._cluster_event(sig.burst.nodes[0], "gpuvigilBreakerOpen",
                                f"circuit breaker: {change.reason}", True)  # fmt: skip

    def _api_error(self, e: ClusterError) -> None:
        if self.metrics:
            self.metrics.api_errors.labels(e.kind).inc()

    def _export(
        self, nodes: list[NodeView], result: PassResult, gate: Gate, held: int, started: float
    ) -> None:
        m = self.metrics
        if m is None:
            return
        counts = dict.fromkeys(State, 0)
        in_service = 0
        for node in nodes:
            d = result.decisions.get(node.name)
            state = d.state if d else (node.record.state if node.record else State.HEALTHY)
            counts[state] += 1
            if (
                state is State.HEALTHY
                and not node.blocked_by_someone_else
                and not (
                    node.blocked_by_us
                    and d is not None
                    and all(op.kind is not OpKind.UNBLOCK for op in d.ops)
                )
            ):
                in_service += 1
            prev = self._shown.get(node.name)
            if prev is not state:
                if prev is not None:
                    m.node_state.remove(node.name, prev.value)
                m.node_state.labels(node.name, state.value).set(1)
                self._shown[node.name] = state
        present = {n.name for n in nodes}
        for gone in [n for n in self._shown if n not in present]:
            m.node_state.remove(gone, self._shown.pop(gone).value)
        for state, count in counts.items():
            m.nodes.labels(state.value).set(count)
        m.nodes_total.set(len(nodes))
        m.nodes_in_service.set(in_service)
        m.breaker_open.set(1 if self.breaker.status.open else 0)
        self._export_signatures(m)
        m.held.set(held)
        for pool in gate.size:
            m.budget_in_use.labels(pool).set(gate.in_use[pool])
            m.budget_limit.labels(pool).set(gate.limit(pool))
        m.reconcile_duration.observe(time.perf_counter() - started)
        m.last_reconcile.set(time.time())

    def _export_signatures(self, m: ControllerMetrics) -> None:
        """One series per open cause, labelled with what it concentrates on (the alert
        names the suspected change from these labels)."""
        now: dict[tuple[str, str, str], int] = {}
        for sig in self.breaker.signatures.values():
            s = sig.signature
            now[(s.code if s.check != "*" else "*", s.attribute, s.value)] = sig.nodes
        for cause in self.breaker.stale.values():
            now[("STALE", self.config.safety.pool_label, cause.pool)] = cause.stale
        for labels in self._signatures - set(now):
            m.breaker_signature.remove(*labels)
        for labels, nodes in now.items():
            m.breaker_signature.labels(*labels).set(nodes)
        self._signatures = set(now)

    # ---- the loop ---------------------------------------------------------------------

    def run(self, stop: threading.Event, *, is_leader: Callable[[], bool] = lambda: True) -> None:
        """Reconcile every `interval_s` while leader, until `stop` is set."""
        while not stop.is_set():
            leader = is_leader()
            if self.metrics:
                self.metrics.is_leader.set(1 if leader else 0)
            if leader:
                try:
                    self.reconcile()
                except Exception:  # keep the loop alive; the next pass starts from the level
                    log.exception("reconcile pass failed")
            # A standby looks again within a second, so it takes over as soon as it leads.
            stop.wait(self.config.interval_s if leader else min(1.0, self.config.interval_s))


def _remediation_results(old: Record, new: Record) -> list[tuple[str, str]]:
    """(action, result) pairs for gpuvigil_remediations_total from one transition."""
    out: list[tuple[str, str]] = []
    if new.state is State.DRAINING and old.state is not State.DRAINING:
        out.append(("DRAIN", "started"))
    if old.state is State.DRAINING and new.state is not State.DRAINING:
        out.append(("DRAIN", "succeeded"))
    if old.state in (State.REMEDIATING, State.VALIDATING) and new.failures > old.failures:
        out.append(((old.step or Action.NONE).value, "failed"))
    # a replacement counts only once the new machine validates
    step_done = old.state is State.REMEDIATING and new.state is State.VALIDATING
    if step_done and old.step and old.step is not Action.REPLACE:
        out.append((old.step.value, "succeeded"))
    if (
        old.state is State.VALIDATING
        and new.state is State.HEALTHY
        and (old.step is Action.REPLACE or old.replaces)
    ):
        out.append((Action.REPLACE.value, "succeeded"))
    if new.state is State.REMEDIATING and new.request_id != old.request_id and new.step:
        out.append((new.step.value, "started"))
    return out


__all__ = ["Conflict", "Controller", "ControllerConfig", "PassResult", "Unavailable", "pool_of"]
