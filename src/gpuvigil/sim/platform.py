"""Layer 2 inside the simulator: the real controller over the in-memory cluster.

Called by the engine in the `platform` and `full` scenarios. The node agent's verdicts
(`sim.detect`) are published on a `MemoryCluster` node (the controller work's simulated
cluster, behind the same `Cluster` interface as the Kubernetes and Slurm adapters); the
real `platform.controller.Controller` reconciles it with the real policy, budgets and
circuit breaker; its operations (block, drain, reset/reboot request, replace) come back to
the simulated fleet. The controller runs when something changes and at the policy's next
deadline (grace, request due, preflight), not every `interval_s`: cost grows with events.

Only nodes in an episode are listed (a HEALTHY node with nothing to report gets no
decision but "healthy"); the list's len() is the fleet size and its `census` counts every
node's attributes (pool, zone, rack, driver, kernel, image), so the budget per pool and the
breaker's test see the whole fleet. During a silence every node is listed, its report
frozen at the silence's start.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from gpuvigil.core.findings import Action, Finding, NodeReport
from gpuvigil.core.wire import summarize
from gpuvigil.platform import policy as policy_mod
from gpuvigil.platform.breaker import HELD
from gpuvigil.platform.clusters.base import unfenced
from gpuvigil.platform.clusters.memory import EPOCH, MemoryCluster, Pod
from gpuvigil.platform.controller import Controller, ControllerConfig, PassResult
from gpuvigil.platform.safety import pool_limit
from gpuvigil.platform.signatures import attributes_of, count
from gpuvigil.platform.state import NodeView, State, pool_of_labels
from gpuvigil.sim import devices
from gpuvigil.sim.adversity import ApiOutage, Outage, Replicas, SplitBrain

# Virtual time has microsecond steps: wake a little after a deadline, never on it.
SLACK_S = 0.01


class FleetList(list[NodeView]):
    """The listed (active) nodes; len() answers the size of the whole fleet, `census` its
    attributes (`platform.signatures.census` reads it)."""

    def __init__(
        self, views: Iterable[NodeView], total: int, census: Counter[tuple[str, str]],
        idle: Counter[str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(views)
        self.total = total
        self.census = census
        self.idle = idle or Counter()  # pool -> idle nodes not listed (`safety.Gate`'s room)

    def __len__(self) -> int:
        return max(self.total, super().__len__())

    def __iter__(self) -> Iterator[NodeView]:
        return super().__iter__()


class SimCluster(MemoryCluster):
    """The controller's in-memory cluster, listing and advancing only active nodes."""

    def __init__(
        self,
        *,
        total: int,
        reset_s: float,
        reboot_s: float,
        preflight_s: float,
        beat_s: float,
        pool_label: str,
    ):
        # agents publish every `beat_s` (inside the policy's staleness): a node whose agent
        # has nothing new stays the same view, and the controller reuses its decision
        super().__init__(
            reset_s=reset_s, reboot_s=reboot_s, preflight_s=preflight_s, heartbeat_s=beat_s,
            pool_label=pool_label,
        )  # fmt: skip
        self.total = total
        self.active: set[str] = set()
        self.census: Counter[tuple[str, str]] = Counter()
        self.agent_skew_s = 0.0  # clock-skew: the agents' clocks this far ahead
        self.controller_calling = False  # api-outage refuses only the controller's calls
        self.serving: object | None = None  # the capacity gate's reads (sim.serving.SimServing)
        # the pods holding GPU `index` of a node (sim.devices); set by the engine
        self.holders_of: Callable[[str, int], list[str]] = lambda _name, _index: []
        self.agents_silent: Callable[[], bool] = lambda: False  # api-outage: nothing lands
        # the free nodes per pool that are not listed (`sim.fleet.Fleet.idle_by_pool`)
        self.idle_of: Callable[[Container[str]], Counter[str]] = lambda _skip: Counter()

    def _only_active(self) -> dict:
        return {n: self.nodes[n] for n in sorted(self.active) if n in self.nodes}

    def _build_view(self, node: Any) -> NodeView:
        """An agent whose clock is ahead stamps its report (and so its heartbeat) ahead."""
        view = super()._build_view(node)
        if not self.agent_skew_s or view.heartbeat_at is None:
            return view
        ahead = timedelta(seconds=self.agent_skew_s)
        health = view.health
        if health is not None:
            health = health.model_copy(update={"generated_at": health.generated_at + ahead})
        return replace(view, heartbeat_at=view.heartbeat_at + ahead, health=health)

    def gpu_holders(self, name: str, gpu_uuid: str) -> list[str] | None:
        """Who holds the GPU, as the agent's PodResources mapping says: a serving replica
        holds its slot's GPUs, a training job's pod every GPU of its node."""
        node = self._call("gpu_holders", name)
        index = devices.index_of(gpu_uuid, gpus=node.gpus) if node is not None else None
        if index is None:
            return None
        return self.holders_of(name, index)

    def list_nodes(self) -> list[NodeView]:
        full, self.nodes = self.nodes, self._only_active()
        try:
            views = super().list_nodes()
        finally:
            self.nodes = full
        return FleetList(views, self.total, self.census, self.idle_of(self.active))

    def advance(self, seconds: float) -> None:
        # a silent agent neither publishes nor answers requests; while the API server is
        # down (api-outage) nothing a node does reaches it
        full, down = self.nodes, self.agents_silent()
        self.nodes = {n: v for n, v in self._only_active().items() if v.agent_alive and not down}
        try:
            super().advance(seconds)
        finally:
            full.update(self.nodes)
            self.nodes = full


@dataclass
class Wake:
    """What the engine must do after a pass: when to pass again, and what changed."""

    at: float | None = None
    drained: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    states: dict[str, State] = field(default_factory=dict)
    steps: int = 0
    evicted: dict[str, list[str]] = field(default_factory=dict)  # one GPU's holders, by node
    isolated: dict[str, str] = field(default_factory=dict)  # node -> its isolated GPU's step


class Platform:
    """The real controller driving the simulated cluster; the engine's layer-2 seam."""

    def __init__(
        self,
        *,
        machines: list[tuple[str, dict[str, str], dict[str, str]]],
        config: ControllerConfig | None,
        reset_s: float,
        reboot_s: float,
        preflight_s: float,
        breaker: bool = True,
        events: object | None = None,
        adversity: ApiOutage | SplitBrain | None = None,
        serving: object | None = None,
        gpus: int = 8,
    ) -> None:
        cfg = config or ControllerConfig()
        if not breaker:  # the control run: no cause ever trips
            off = {"breaker_min_nodes": 10**9, "breaker_min_change_nodes": 10**9,
                   "breaker_stale_min_nodes": 10**9}  # fmt: skip
            cfg = cfg.model_copy(update={"safety": cfg.safety.model_copy(update=off)})
        self.config = cfg
        self.cluster = SimCluster(
            total=len(machines), reset_s=reset_s, reboot_s=reboot_s, preflight_s=preflight_s,
            beat_s=0.8 * cfg.policy.heartbeat_stale_s, pool_label=cfg.safety.pool_label,
        )  # fmt: skip
        # the capacity gate's reads and writes (`sim.serving.SimServing`), as a Kubernetes
        # cluster's `serving`; None: no serving pool behind a gate
        self.cluster.serving = serving
        self.gpus = gpus  # every node's device plugin registers this many
        # a serving node's pods (`sim.serving`); None for a node that trains
        self.pods_of: Callable[[str], list[str] | None] = lambda _name: None
        # name -> (labels, facts): the same dicts the engine's nodes carry
        self.machines = {name: (labels, facts) for name, labels, facts in machines}
        self.recount()
        self.silent_since: datetime | None = None

        def make(cluster: SimCluster, **kw: object) -> Controller:
            return Controller(cluster, config=cfg, events=events, **kw)  # type: ignore[arg-type]

        self.t = 0.0
        self.outage = self.replicas = None
        if isinstance(adversity, SplitBrain):
            self.replicas = Replicas(
                self.cluster, make=make, settings=cfg.lease, spec=adversity,
                limits=self.limits(), now=lambda: self.t,
            )  # fmt: skip
            self.controller = self.replicas.ctl["a"]
        else:
            self.controller = make(self.cluster, clock=self.cluster.clock.now)
        if isinstance(adversity, ApiOutage):
            self.outage = Outage(self.cluster, adversity, lambda: self.t)
        self.passes = 0
        self.in_quarantine: set[str] = set()  # nodes whose last decision was QUARANTINED
        self._nudged: set[tuple[object, str, object]] = set()  # probes passed on (_breaker_closes)
        self.held_retry_s = max(cfg.interval_s, 60.0)
        for name in ("gpuvigil.controller", "gpuvigil.leader"):
            logging.getLogger(name).setLevel(logging.ERROR)

    def limits(self) -> dict[str, int]:
        """Each pool's disruption budget, as the safety rules compute it for its size."""
        safety = self.config.safety
        sizes = Counter(pool_of_labels(labels, label=safety.pool_label) for labels, _ in
                        self.machines.values())  # fmt: skip
        return {pool: pool_limit(pool, n, safety) for pool, n in sizes.items()}

    # --- the world side -------------------------------------------------------------------
    def recount(self) -> None:
        """The fleet's attribute census (after a storm changed a driver or an image)."""
        safety = self.config.safety
        self.cluster.census = count(
            attributes_of(labels, facts, pool=pool_of_labels(labels, label=safety.pool_label),
                          config=safety)
            for labels, facts in self.machines.values()
        )  # fmt: skip
        for name, node in self.cluster.nodes.items():
            if name in self.machines:
                node.attributes = dict(self.machines[name][1])
                node.version += 1

    def _add(self, name: str) -> None:
        labels, facts = self.machines.get(name, ({}, {}))
        pool = pool_of_labels(labels, label=self.config.safety.pool_label)
        self.cluster.add_node(name, pool=pool, labels=labels, attributes=facts, gpus=self.gpus)

    def _hush(self, name: str) -> None:
        """During a silence the controller keeps seeing the report from before it."""
        node = self.cluster.nodes.get(name)
        if node is not None and self.silent_since is not None:
            node.heartbeat_at = self.silent_since
            node.agent_alive = False

    def silence(self, names: Iterable[str]) -> None:
        """Every agent stops reporting: each node is listed with its last report."""
        self.silent_since = self.cluster.clock.now()
        for name in names:
            if name not in self.cluster.nodes:
                self._add(name)
            self._hush(name)
            self.cluster.active.add(name)

    def speak(self) -> None:
        """The reports are back: every agent publishes again."""
        self.silent_since = None
        now = self.cluster.clock.now()
        for node in self.cluster.nodes.values():
            node.agent_alive = True
            node.heartbeat_at = now
            node.version += 1

    def at(self, t: float) -> None:
        if t > self.t:
            self.cluster.advance(t - self.t)
            self.t = t

    def publish(self, name: str, findings: Iterable[Finding], *, fixed_by: Action | None,
                running: bool) -> None:  # fmt: skip
        """The node's agent publishes these problems (they clear when `fixed_by` runs)."""
        if name not in self.cluster.nodes:
            self._add(name)
        summary = summarize(NodeReport(node=name, findings=tuple(findings)))
        self.cluster.set_findings(name, list(summary.findings), fixed_by=fixed_by)
        if self.replicas is not None:
            self.replicas.news = True
        self._hush(name)
        self.set_running(name, running=running)
        self.cluster.active.add(name)

    def clear(self, name: str) -> None:
        if name in self.cluster.nodes:
            self.cluster.clear_findings(name)
            self._hush(name)
            self.gpus_out(name, set())

    def gpus_out(self, name: str, out: set[int]) -> None:
        """The device plugin's unhealthy GPUs on the node now (all healthy again after a
        repair: the plugin restarts with the node's GPU daemons)."""
        node = self.cluster.nodes.get(name)
        if node is None or node.gpus_out == out:
            return
        node.gpus_out = set(out)
        node.version += 1

    def set_running(self, name: str, *, running: bool) -> None:
        """The node's pods: its training job's, or its serving replicas."""
        node = self.cluster.nodes.get(name)
        if node is None:
            return
        replicas = self.pods_of(name)
        if replicas is not None:
            node.pods = [Pod(p) for p in replicas]
        else:
            node.pods = [Pod(f"{name}-job")] if running else []

    def faults_cleared(self, name: str) -> bool:
        node = self.cluster.nodes.get(name)
        return node is None or not node.faults

    def release(self, name: str) -> None:
        """A person repaired a quarantined node: `gpuvigil release NODE`."""
        node = self.cluster.nodes.get(name)
        if node is None:
            return
        self.cluster.clear_findings(name)
        person = self.cluster.replica()  # a person's write: no controller's fence
        person.fence = unfenced
        view = person.get_node(name)
        rec = policy_mod.release(view.record, now=self.cluster.clock.now(), who="sim")
        person.store(name, rec)

    def arrive(self, name: str) -> None:
        """A replacement machine has arrived: it takes part again (and validates)."""
        node = self.cluster.nodes.get(name)
        if node is not None:
            # MemoryCluster re-adds a replaced node under the same name, and the controller
            # stores the REPLACE step's record on it right after: a new machine has no
            # record (a real cluster's replacement is a new Node), so drop it here.
            node.record_raw = None
            node.heartbeat_at = self.cluster.clock.now()
            self._hush(name)
            self.cluster.active.add(name)

    # --- one pass -------------------------------------------------------------------------
    def reconcile(self) -> Wake:
        self.passes += 1
        before = {n: len(self.cluster.nodes[n].evicted) for n in self.cluster.active
                  if n in self.cluster.nodes}  # fmt: skip
        replaced_before = len(self.cluster.replaced)
        result = self._pass()
        wake = Wake()
        now = self.cluster.clock.now()
        if not result.listed:  # it acted on nothing: look again soon
            wake.at = self.t + self.held_retry_s
        # a breaker probe stays listed until the breaker has seen how its repair ended
        probes = {s.probe for s in self.controller.breaker.signatures.values() if s.probe}
        for name in self.cluster.replaced[replaced_before:]:
            wake.replaced.append(name)
            self.cluster.active.discard(name)  # the new machine arrives replace_s later
        for name, d in result.decisions.items():
            node = self.cluster.nodes.get(name)
            if node is None:
                continue
            wake.states[name] = d.state
            if len(node.evicted) > before.get(name, 0):
                if d.state is State.HEALTHY and node.isolation_raw:  # one GPU's holders
                    wake.evicted[name] = [p.name for p in node.evicted[before.get(name, 0) :]]
                else:
                    wake.drained.append(name)
            if any(op.kind.value in ("request", "replace") for op in d.ops):
                wake.steps += 1
            # a quarantine begins this pass (a record rewritten in QUARANTINED, e.g. for its
            # breaker mark, is the same quarantine: counting it again made false ones)
            if d.state is State.QUARANTINED and name not in self.in_quarantine:
                wake.quarantined.append(name)
                self.in_quarantine.add(name)
            elif d.state is not State.QUARANTINED:
                self.in_quarantine.discard(name)
            nxt = self._next(name, d, now)
            if nxt is not None:
                nxt = max(nxt, self.t + SLACK_S)
            if nxt is not None and (wake.at is None or nxt < wake.at):
                wake.at = nxt
            quiet = d.state is State.HEALTHY and not node.faults and not node.our_taints
            if quiet and name not in probes:
                self.cluster.active.discard(name)
        wake.isolated = dict(result.isolated)
        if any(step != "isolated" for step in wake.isolated.values()):
            # the GPU's ladder moves on its own deadlines (grace, the reset's answer)
            soon = self.t + self.held_retry_s
            wake.at = soon if wake.at is None else min(wake.at, soon)
        closes = self._breaker_closes(wake.states)
        if closes is not None and (wake.at is None or closes < wake.at):
            wake.at = closes
        attack = self.replicas or self.outage
        extra = attack.wake(self.t) if attack is not None else None
        if extra is not None and (wake.at is None or extra < wake.at):
            wake.at = max(extra, self.t + SLACK_S)
        return wake

    def _pass(self) -> PassResult:
        """The controller's pass; under `split-brain` each replica that leads passes (the
        decisions merged, the later replica's last)."""
        if self.replicas is not None:
            results = self.replicas.reconcile()
            merged = PassResult(at=self.cluster.clock.now())
            for r in results:
                # A fenced pass (the stalled replica's resumed pass on its old list) wrote
                # nothing: its decisions are not the cluster's. Applying them put a node the
                # leader had just quarantined back in service (HEALTHY from the list read
                # before its finding), a job landed on it and gave up (split-brain at 1,024).
                if not r.fenced:
                    merged.decisions.update(r.decisions)
            return merged
        self.cluster.controller_calling = True
        try:
            result = self.controller.reconcile()
        finally:
            self.cluster.controller_calling = False
        if self.outage is not None:
            self.outage.passed(result)
        return result

    def adversity(self) -> dict[str, object]:
        """What an attack saw (Results.adversity); empty without one."""
        attack = self.replicas or self.outage
        return attack.report() if attack is not None else {}

    def _breaker_closes(self, states: dict[str, State]) -> float | None:
        """A cause that is gone closes `breaker_close_after_s` later; an open signature
        starts probing `breaker_probe_after_s` after it opened: pass then, so both happen
        on time even when nothing else happens. A probe whose node this pass quarantined
        (or that left the list) ends at the breaker's next look: pass at once, so the next
        probe's wait starts now, not at the next news (hours later)."""
        br, safety = self.controller.breaker, self.config.safety
        times = [c.clear_since for c in (*br.signatures.values(), *br.stale.values())
                 if c.clear_since is not None]  # fmt: skip
        due = [seconds(t - EPOCH) + safety.breaker_close_after_s for t in times]
        for sid, sig in br.signatures.items():
            ending = sig.probe and (states.get(sig.probe) is State.QUARANTINED
                                    or sig.probe not in self.cluster.active)  # fmt: skip
            if ending and (key := (sid, sig.probe, sig.probe_since)) not in self._nudged:
                self._nudged.add(key)  # once per probe: never a pass loop
                due.append(self.t)
            if not sig.probe:
                due.append(seconds(sig.probe_due(safety) - EPOCH))
        if not due:
            return None
        return max(min(due) + SLACK_S, self.t + SLACK_S)

    def _next(self, name: str, d: policy_mod.Decision, now: object) -> float | None:
        """When this node's state can next change without news from the world."""
        rec, cfg, node = d.record, self.config.policy, self.cluster.nodes[name]
        since = (rec.since - EPOCH).total_seconds() if rec.since else self.t
        if d.held and not d.held.startswith(HELD):  # the breaker's holds change with news
            return self.t + self.held_retry_s
        if d.state is State.SUSPECT:
            for limit in sorted((cfg.fatal_grace_s, cfg.suspect_grace_s, cfg.suspect_max_s)):
                if since + limit > self.t:
                    return since + limit + SLACK_S
            return self.t + self.held_retry_s
        if d.state is State.DRAINING:
            held = getattr(self.cluster.serving, "s", None)
            if held is not None and name in held.held:  # the capacity gate holds it:
                return self.t + self.held_retry_s  # the replicas' Ready passes sooner
            return self.t + 1.0
        if d.state is State.REMEDIATING:
            if node.request is not None:
                return (node.request[2] - EPOCH).total_seconds() + SLACK_S
            return self.t + 1.0
        if d.state is State.VALIDATING:
            return max(self.t + 1.0, since + self.cluster.preflight_s + 1.0)
        if d.state is State.HEALTHY and node.our_taints:
            return self.t + 1.0
        slowed = any(f.code in cfg.slowing_codes for f in d.findings)
        if d.state is State.QUARANTINED and node.pods and slowed:  # its work moves next pass
            return self.t + self.config.interval_s
        return None


def seconds(td: timedelta) -> float:
    return td.total_seconds()
