"""What the controller says about what it does: the event log (`core.events`), Kubernetes
Events on the nodes, log lines and the Prometheus metrics. Used by `platform.controller`
(one `Announcer` per controller); it never decides and never changes a node.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from gpuvigil.core import events
from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.core.findings import Action
from gpuvigil.core.states import REMOVED
from gpuvigil.platform.breaker import Breaker, Change
from gpuvigil.platform.clusters.base import Cluster, ClusterError, NodeView
from gpuvigil.platform.metrics import GPU_STEPS, ControllerMetrics
from gpuvigil.platform.policy import Decision, OpKind, PolicyConfig, state_deadline
from gpuvigil.platform.safety import Gate
from gpuvigil.platform.state import Record, State

if TYPE_CHECKING:
    from gpuvigil.platform.controller import PassResult

log = logging.getLogger("gpuvigil.controller")
MAX_GAP_S = 300.0  # the longest time between passes counted in the availability SLI


class Announcer:
    def __init__(
        self,
        cluster: Cluster,
        *,
        dry_run: bool,
        metrics: ControllerMetrics | None,
        events: EventWriter | None,
    ) -> None:
        self.cluster, self.dry_run = cluster, dry_run
        self.metrics, self.events = metrics, events
        self._said: dict[str, str] = {}  # node -> last held/left-alone message (no spam)
        self._shown: dict[str, State] = {}  # node -> state exported in gpuvigil_node_state
        self._clocks: dict[str, tuple[str, ...]] = {}  # node -> its deadline series' labels
        self._announced: set[str] = set()  # nodes whose state this process has put on record
        self._signatures: set[tuple[str, str, str]] = set()  # exported signature series
        self._hardware: set[tuple[str, str, str]] = set()
        self._episodes: set[str] = set()  # nodes with a gpuvigil_machine_episodes series
        # the last pass's (time, nodes out of service), for the SLI's counter
        self._out: tuple[datetime, int] | None = None

    def transition(self, node: NodeView, old: Record, d: Decision, now: datetime) -> None:
        new = d.record
        if new.state is not old.state:
            verb = "would move" if self.dry_run else "moved"
            msg = f"{verb} {old.state.value} -> {new.state.value}: {d.reason}"
            log.info("node %s: %s", node.name, msg)
            self.event(
                node.name,
                Kind.NODE_STATE,
                now,
                **{
                    "from": old.state.value,
                    "to": new.state.value,
                    "reason": d.reason,
                    **cause_fields(d),
                    "dry_run": self.dry_run,
                },
            )
            if not self.dry_run:
                warn = new.state in (State.QUARANTINED, State.DRAINING, State.REMEDIATING)
                self.cluster_event(node.name, f"gpuvigil{new.state.value.title()}", msg, warn)
        for action, res in remediation_results(old, new):
            if self.metrics:
                self.metrics.remediations.labels(action, res).inc()
            self.event(node.name, Kind.REMEDIATION, now, action=action, result=res, reason=d.reason)

    def observed(self, nodes: Iterable[NodeView], now: datetime) -> None:
        """One `node.state` event (`from: null`) per node the first time this process sees
        it, so availability counts nodes that never change state, and a restarted
        controller's log stands on its own."""
        for node in nodes:
            if node.name in self._announced:
                continue
            self._announced.add(node.name)
            state = (node.record or Record()).state
            self.event(
                node.name,
                Kind.NODE_STATE,
                now,
                **{"from": None, "to": state.value, "reason": "observed", "dry_run": self.dry_run},
            )

    def removed(self, node: NodeView, old: Record, now: datetime) -> None:
        """A replacement deleted the node object, and its record with it: say so (`node.state`
        to REMOVED, `core.states`), so layer 4 stops counting a machine that left the fleet;
        a successor of that name is announced anew."""
        self.event(node.name, Kind.NODE_STATE, now, **{
            "from": old.state.value, "to": REMOVED, "reason": "replaced: node deleted",
            "dry_run": False})  # fmt: skip
        self._announced.discard(node.name)

    def say(self, name: str, message: str, now: datetime) -> None:
        if self._said.get(name) == message:
            return
        self._said[name] = message
        log.info("node %s: %s", name, message)
        self.event(name, Kind.REMEDIATION, now, action="NONE", result="skipped", reason=message)

    def event(self, node: str, kind: Kind, now: datetime, **data: object) -> None:
        if self.events is not None:
            self.events.write(
                Event(
                    ts=now.timestamp(), kind=kind.value, source="controller", node=node, data=data
                )
            )

    def cluster_event(self, node: str, reason: str, message: str, warning: bool) -> None:
        try:
            self.cluster.record_event(node, reason=reason, message=message, warning=warning)
        except ClusterError as e:  # an event is not worth failing a transition for
            self.api_error(e)

    def breaker_changed(self, breaker: Breaker, change: Change, now: datetime) -> None:
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
        hardware = bool(change.detail.get("hardware"))
        if self.metrics and change.state == "open" and not hardware:
            self.metrics.breaker_trips.inc()
        sig = breaker.signatures.get(change.cause)
        if change.state == "open" and sig is not None and not self.dry_run:
            # a cluster event people see (`kubectl get events`), on the burst's first node
            reason = "gpuvigilHardwareEvent" if hardware else "gpuvigilBreakerOpen"
            what = "hardware event" if hardware else "circuit breaker"
            self.cluster_event(sig.burst.nodes[0], reason, f"{what}: {change.reason}", True)

    def _count_unavailable(self, m: ControllerMetrics, now: datetime, out: int) -> None:
        """Add the node-seconds out of service since the last pass: the nodes out then,
        for the time since (what the controller last saw held until now), by the
        controller's clock (the simulator's, in a simulation). A gap past `MAX_GAP_S` is
        a pass that did not run here (a standby, whose leader counted those seconds, or
        an outage): not counted twice, nor guessed."""
        if self._out is not None:
            since, was_out = self._out
            gap = (now - since).total_seconds()
            if 0 < gap <= MAX_GAP_S:
                m.node_unavailable_seconds.inc(was_out * gap)
        self._out = (now, out)

    def export_signatures(self, m: ControllerMetrics, breaker: Breaker, pool_label: str) -> None:
        """One series per open cause, labelled with what it concentrates on (the alert
        names the suspected change from these labels)."""
        now: dict[tuple[str, str, str], int] = {}
        hardware: dict[tuple[str, str, str], int] = {}
        for sig in breaker.signatures.values():
            s = sig.signature
            into = hardware if sig.hardware else now
            into[(s.code if s.check != "*" else "*", s.attribute, s.value)] = sig.nodes
        for cause in breaker.stale.values():
            now[("STALE", pool_label, cause.pool)] = cause.stale
        for labels in self._signatures - set(now):
            m.breaker_signature.remove(*labels)
        for labels in self._hardware - set(hardware):
            m.hardware_event.remove(*labels)
        for labels, nodes in now.items():
            m.breaker_signature.labels(*labels).set(nodes)
        for labels, nodes in hardware.items():
            m.hardware_event.labels(*labels).set(nodes)
        self._signatures, self._hardware = set(now), set(hardware)

    def _export_clocks(
        self, m: ControllerMetrics, nodes: list[NodeView], result: PassResult, policy: PolicyConfig
    ) -> None:
        """Per node out of service: when it left service, and its state's deadline."""
        now: dict[str, tuple[str, ...]] = {}
        for node in nodes:
            d = result.decisions.get(node.name)
            record = d.record if d else node.record
            if record is None or (since := record.out_of_service_since()) is None:
                continue
            m.out_of_service_since.labels(node.name).set(since.timestamp())
            now[node.name] = ()
            deadline = state_deadline(record, policy)
            if deadline is not None:
                m.state_deadline.labels(node.name, record.state.value).set(deadline.timestamp())
                now[node.name] = (record.state.value,)
        for name, labels in self._clocks.items():
            if name not in now:
                m.out_of_service_since.remove(name)
            if labels and now.get(name) != labels:
                m.state_deadline.remove(name, *labels)
        self._clocks = now

    def api_error(self, e: ClusterError) -> None:
        if self.metrics:
            self.metrics.api_errors.labels(e.kind).inc()

    def export(
        self,
        nodes: list[NodeView],
        result: PassResult,
        *,
        gate: Gate,
        breaker: Breaker,
        held: int,
        started: float,
        policy: PolicyConfig | None = None,
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
        episodes = {n.name: len(n.record.episodes) for n in nodes
                    if n.record is not None and n.record.episodes}  # fmt: skip
        for gone in self._episodes - set(episodes):
            m.machine_episodes.remove(gone)
        for name, count in episodes.items():
            m.machine_episodes.labels(name).set(count)
        self._episodes = set(episodes)
        if len(self._shown) > len(nodes):
            present = {n.name for n in nodes}
            for gone in [n for n in self._shown if n not in present]:
                m.node_state.remove(gone, self._shown.pop(gone).value)
        steps = Counter(result.isolated.values())
        for step in GPU_STEPS:
            m.gpus_isolated.labels(step).set(steps[step])
        self._export_clocks(m, nodes, result, policy or PolicyConfig())
        for state, count in counts.items():
            m.nodes.labels(state.value).set(count)
        m.nodes_total.set(len(nodes))
        m.nodes_in_service.set(in_service)
        self._count_unavailable(m, result.at, len(nodes) - in_service)
        m.breaker_open.set(1 if breaker.status.open else 0)
        self.export_signatures(m, breaker, gate.config.pool_label)
        m.held.set(held)
        for pool in gate.size:
            m.budget_in_use.labels(pool).set(gate.in_use[pool])
            m.budget_limit.labels(pool).set(gate.limit(pool))
        m.decisions.labels("decided").inc(result.decided)
        m.decisions.labels("reused").inc(len(result.decisions) - result.decided)
        watch_age = getattr(self.cluster, "watch_age_s", None)
        if watch_age is not None:
            m.watch_age.set(watch_age())
        m.reconcile_duration.observe(time.perf_counter() - started)
        m.last_reconcile.set(time.time())


def cause_fields(d: Decision) -> dict[str, list[str]]:
    """The structured why of a transition (`core.events.cause_fields`) from the problems
    the policy saw: a drain for `CHECK_TIMEOUT` on `gpu:3` is a hung GPU, on `node` a hung
    tool. `reason` says the same for people."""
    return events.cause_fields(d.findings)


def remediation_results(old: Record, new: Record) -> list[tuple[str, str]]:
    """(action, result) pairs for gpuvigil_remediations_total from one transition."""
    out: list[tuple[str, str]] = []
    if new.state is State.DRAINING and old.state is not State.DRAINING:
        out.append(("DRAIN", "started"))
    if old.state is State.DRAINING and new.state is not State.DRAINING:
        out.append(("DRAIN", "succeeded"))
    # a quarantined node's work moved off (`policy._quarantined`: it slows a gang): the
    # node stays QUARANTINED, so this drain has no state of its own to end in
    moved = new.last_action_at is not None and new.last_action_at != old.last_action_at
    if moved and old.state is new.state is State.QUARANTINED:
        out.append(("DRAIN", "started"))
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
