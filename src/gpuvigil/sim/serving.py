"""An always-on serving workload in the simulator: a Deployment of replicas on its own nodes.

Called by the engine (`sim.engine`, `sim.lifecycle`, `sim.episodes`) when the workload has a
serving share (`Workload.serving_fraction`), and by the real controller's capacity gate
(`platform.serving_hook`) through `SimServing`, the simulated cluster's `serving` (the same
reads and writes as `clusters.k8s_serving` on Kubernetes).

The model (docs/simulator.md "Serving and per-GPU isolation"):
- The last `serving_fraction` of the fleet's nodes serve; no training job lands there.
  Each node's GPUs are cut into slots of `gpus_per_replica`; a replica holds one slot.
- Demand follows a day: `serving_low` to `serving_high` of the slots, in hourly steps.
  The HPA (`hpa/serving`'s `status.desiredReplicas`, the gate's demand signal) asks for the
  next hour's demand when it is higher (a scheduled scaler), and the Deployment runs that
  plus what a make-before-break added.
- A replica is Ready `replica_start_s` after it was placed (the model's weights load), while
  its node is in service (a cordon leaves it running) and no fault that stops work (a crash
  or a hang) is on its GPUs or the node. A replica on a broken GPU keeps crash-looping
  where it is: Kubernetes does not move it (kubernetes #60388) until someone evicts it.
- Replicas on a node taken out of service (drained, repaired, down) are gone, and the
  Deployment places new ones on free slots: Ready after `replica_start_s`. A free slot is
  on a schedulable serving node, unheld, with no fault anyone has seen on its GPUs (the
  device plugin and the cordon keep new pods off those).
- `serving_minutes_below_demand` counts the minutes during which fewer replicas were Ready
  than the demand asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuvigil.platform.capacity import Demand, PoolState, Replica, ScaleMark, Step, required
from gpuvigil.platform.clusters.memory import EPOCH
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.serving_pool import DemandSource, ServingPool, WorkloadRef
from gpuvigil.sim import devices
from gpuvigil.sim.faults import NODE_WIDE, Cause, Effect, FaultKind
from gpuvigil.sim.fleet import Node, NodeState

if TYPE_CHECKING:
    from gpuvigil.sim.engine import Engine

HOUR = 3600.0
DAY = 86400.0
POOL = ServingPool(
    name="serving", namespace="sim", workload=WorkloadRef(name="serving"),
    demand=[DemandSource(kind="hpa", name="serving")],
)  # fmt: skip
STOPS = (Effect.CRASH, Effect.HANG)  # a replica on such a fault serves nothing
RUNNING = (NodeState.UP, NodeState.CORDONED)  # a cordon keeps new pods off, not running ones


@dataclass(eq=False)
class Pod:
    name: str
    node: int
    slot: int
    ready_at: float


def stops(kind: FaultKind) -> bool:
    """The fault stops a replica: a crash or a hang of the hardware. A fabric fault (EFA)
    crashes training's collectives across nodes, not a replica that serves from within
    one node (its requests come over the host's own network)."""
    return kind.persistent and kind.effect in STOPS and kind.cause is not Cause.NETWORK


def pool_for(gpus_per_replica: int) -> ServingPool:
    """The simulated serving pool, as an operator would configure it (`controller.serving`)."""
    return POOL.model_copy(update={"gpus_per_replica": gpus_per_replica})


class Serving:
    """The serving Deployment's replicas, its demand, and what it was short of."""

    def __init__(self, engine: Engine, nodes: list[Node]) -> None:
        cfg = engine.cfg
        self.engine = engine
        self.nodes = nodes
        self.ids = {n.id for n in nodes}
        self.gpr = max(1, min(cfg.gpus_per_replica, cfg.gpus_per_node))
        self.slots_per_node = cfg.gpus_per_node // self.gpr
        self.slots = len(nodes) * self.slots_per_node
        self.start_s = cfg.replica_start_s
        self.low, self.high = cfg.serving_low, cfg.serving_high
        self.pods: dict[str, Pod] = {}
        self.where: dict[tuple[int, int], str] = {}  # (node, slot) -> pod name
        self.seq = 0
        self.demand = self.demand_at(0.0)
        # The HPA's desiredReplicas: the curve an hour ahead when it rises (a scheduled
        # scaler starts replicas before the load comes, so the day's curve alone never
        # leaves the pool short; what does is what a fault or a repair does)
        self.hpa = max(self.demand, self.demand_at(HOUR))
        self.added = 0  # a make-before-break's replicas (the mark's `added`)
        self.mark: ScaleMark | None = None
        self.held: dict[str, datetime] = {}  # node -> since when the gate holds its step
        self.last_t = 0.0
        self.short = False
        self.below_s = 0.0
        self.ready = 0
        self.isolated: dict[int, set[int]] = {}  # node -> GPUs the controller isolated
        self.kept_gpu_s = 0.0  # GPU-seconds Ready replicas served beside an isolated GPU
        self.kept_ready = 0  # Ready replicas on machines with a GPU isolated, now
        self.suspect: set[int] = set()  # nodes out of service or with a fault that stops work
        self.dirty: set[int] = set()  # nodes whose pods changed, for the controller's list
        self.no_room = False  # the last look found no free slot, and nothing changed since
        self.cursor = 0  # where the next look for a free slot starts (index in `nodes`)
        self.names = {n.id: n.name for n in nodes}
        self.ids_of = [self.device_ids(k) for k in range(self.slots_per_node)]
        self.ready_events: set[float] = set()  # when a placed replica turns Ready
        self.update(0.0, warm=True)

    # --- demand ------------------------------------------------------------------------
    def demand_at(self, t: float) -> int:
        """Replicas asked for at `t`: a day's curve, lowest at midnight, in hourly steps."""
        hour = math.floor(t / HOUR) * HOUR
        day = (1 - math.cos(2 * math.pi * hour / DAY)) / 2
        return max(1, round(self.slots * (self.low + (self.high - self.low) * day)))

    @property
    def desired(self) -> int:
        """The Deployment's replicas: the HPA's, plus a make-before-break's."""
        return self.hpa + self.added

    # --- slots and readiness -------------------------------------------------------------
    def gpus(self, slot: int) -> range:
        return range(slot * self.gpr, (slot + 1) * self.gpr)

    def device_ids(self, slot: int) -> frozenset[str]:
        """The slot's GPUs as the gate names them: a node step's components (`gpu:3`)
        and a GPU step's UUIDs (`serving_hook.step_for`, `gpu_step`)."""
        return frozenset(x for g in self.gpus(slot) for x in (f"gpu:{g}", devices.fake_uuid(g)))

    def hit(self, node: Node, slot: int) -> bool:
        """A fault that stops work is on this slot's GPUs (or the whole node)."""
        gpus = self.gpus(slot)
        return any(stops(f.kind) and (f.kind.fault in NODE_WIDE or f.gpu in gpus)
                   for f in node.faults)  # fmt: skip

    def is_ready(self, pod: Pod, t: float) -> bool:
        node = self.engine.fleet.nodes[pod.node]
        return pod.ready_at <= t and node.state in RUNNING and not self.hit(node, pod.slot)

    def free(self, node: Node, slot: int) -> bool:
        """A new replica may land here: the node takes new work and no GPU of the slot is
        known bad (seen by a check, or isolated)."""
        if node.state is not NodeState.UP or (node.id, slot) in self.where:
            return False
        gpus = set(self.gpus(slot))
        if gpus & self.isolated.get(node.id, set()):
            return False
        return not any(
            f.detected_s is not None and (f.kind.fault in NODE_WIDE or f.gpu in gpus)
            for f in node.faults
        )  # fmt: skip

    # --- the Deployment ----------------------------------------------------------------
    def update(self, t: float, *, warm: bool = False) -> None:
        """Count the time since the last change, then let the Deployment converge."""
        if t > self.last_t:
            self.below_s += (t - self.last_t) if self.short else 0.0
            self.kept_gpu_s += (t - self.last_t) * self.kept_ready * self.gpr
        self.last_t = max(self.last_t, t)
        fleet = self.engine.fleet.nodes
        for name in [n for nid in self.suspect if fleet[nid].state not in RUNNING
                     for n in self.pods_on(nid)]:  # fmt: skip
            self._delete(name)  # drained, repaired, down: the pod is gone
        if len(self.pods) > self.desired:  # scale down: not Ready ones first, then newest
            order = sorted(self.pods.values(), key=lambda p: (self.is_ready(p, t), -p.ready_at))
            for pod in order[: len(self.pods) - self.desired]:
                self._delete(pod.name)
        missing = self.desired - len(self.pods)
        if missing > 0 and not self.no_room:
            count = len(self.nodes)
            for i in range(count):  # from where the last replica went (the scheduler's
                node = self.nodes[(self.cursor + i) % count]  # spread; a full scan is rare)
                for slot in range(self.slots_per_node):
                    if missing and self.free(node, slot):
                        self._place(node, slot, t, warm=warm)
                        missing -= 1
                if not missing:
                    self.cursor = (self.cursor + i) % count
                    break
            self.no_room = missing > 0  # look again when a node or a slot changes
        suspect = self.suspect
        ready = [p for p in self.pods.values() if p.ready_at <= t
                 and (p.node not in suspect or self.is_ready(p, t))]  # fmt: skip
        self.ready = len(ready)
        self.kept_ready = sum(1 for p in ready if p.node in self.isolated)
        self.short = self.ready < self.demand
        if self.dirty:
            fleet = self.engine.fleet.nodes
            self.engine.sync_pods([fleet[n] for n in sorted(self.dirty)])
            self.dirty.clear()

    def changed(self, node: Node, t: float) -> None:
        """The fleet's news of one serving node (`Fleet.on_change`)."""
        bad = node.state not in RUNNING or any(stops(f.kind) for f in node.faults)
        (self.suspect.add if bad else self.suspect.discard)(node.id)
        self.no_room = False
        self.update(t)

    def _place(self, node: Node, slot: int, t: float, *, warm: bool) -> None:
        self.seq += 1
        name = f"serving-{self.seq}"
        at = t if warm else t + self.start_s  # the run starts with the pool up
        self.pods[name] = Pod(name, node.id, slot, at)
        self.where[(node.id, slot)] = name
        self.dirty.add(node.id)
        if not warm and at not in self.ready_events:  # one event for replicas placed together
            self.ready_events.add(at)
            self.engine.push(at, SERVING_READY, None)

    def _delete(self, name: str) -> None:
        pod = self.pods.pop(name)
        self.where.pop((pod.node, pod.slot), None)
        self.no_room = False
        self.dirty.add(pod.node)

    def evict(self, node: Node, names: list[str], t: float) -> int:
        """The controller evicted these pods (a GPU's holders): the Deployment replaces them."""
        gone = [n for n in names if n in self.pods and self.pods[n].node == node.id]
        for name in gone:
            self._delete(name)
        self.update(t)
        return len(gone)

    def pods_on(self, nid: int) -> list[str]:
        return [n for s in range(self.slots_per_node)
                if (n := self.where.get((nid, s))) is not None]  # fmt: skip

    def on_node(self, node: Node) -> list[Pod]:
        return [self.pods[n] for s in range(self.slots_per_node)
                if (n := self.where.get((node.id, s))) is not None]  # fmt: skip

    def pods_named(self, name: str) -> list[str] | None:
        """The replicas on the node named `name`; None for a node that does not serve."""
        nid = self.engine.by_name.get(name)
        if nid is None or nid not in self.ids:
            return None
        return [p.name for p in self.on_node(self.engine.fleet.nodes[nid])]

    def holders(self, node: Node, gpu: int) -> list[str]:
        return [p.name for p in self.on_node(node) if gpu in self.gpus(p.slot)]

    def isolate(self, isolated: dict[int, set[int]], t: float) -> None:
        """The GPUs the controller isolates now (node -> indices), for the kept GPU-hours."""
        mine = {n: g for n, g in isolated.items() if n in self.ids}
        if mine != self.isolated:
            self.update(t)
            self.isolated = mine
            self.no_room = False
            self.update(t)

    def on_demand(self, t: float) -> None:
        self.update(t)
        self.demand = self.demand_at(t)
        self.hpa = max(self.demand, self.demand_at(t + HOUR))
        self.update(t)

    def finish(self, t: float) -> float:
        """Minutes below demand over the run."""
        self.update(t)
        return self.below_s / 60.0


def controller_config(
    config: ControllerConfig, *, gpus_per_replica: int, gate: bool, isolation: bool
) -> ControllerConfig:
    """The run's controller settings: the serving pool behind the capacity gate (`gate`),
    and per-GPU isolation on or off, as an operator would set them."""
    update: dict[str, Any] = {}
    if gate:
        pools = [pool_for(gpus_per_replica)]
        update["serving"] = config.serving.model_copy(update={"pools": pools})
    iso = getattr(config, "isolation", None)
    if iso is not None and iso.enabled != isolation:
        update["isolation"] = iso.model_copy(update={"enabled": isolation})
    return config.model_copy(update=update) if update else config


class SimServing:
    """What the capacity gate reads and writes (`clusters.k8s_serving.ServingPools`' calls),
    over the simulated Deployment. Times come from the controller's clock."""

    def __init__(self, serving: Serving, *, now: Any) -> None:
        self.s = serving
        self.now = now  # () -> the engine's time in seconds

    def _t(self, at: datetime | None) -> float:
        return (at - EPOCH).total_seconds() if at is not None else self.now()

    def nodes(self) -> list[Any]:
        return []  # `state` reads the simulated fleet itself

    def held_since(self, name: str) -> datetime | None:
        return self.s.held.get(name)

    def set_held(self, name: str, *, reason: str, message: str, now: datetime | None) -> None:
        if reason:
            self.s.held.setdefault(name, now or EPOCH)
        else:
            self.s.held.pop(name, None)

    def mark(self, pool: ServingPool) -> ScaleMark | None:
        return self.s.mark

    def state(self, pool: ServingPool, step: Step, *, now: datetime, nodes: Any) -> PoolState:
        s, t = self.s, self._t(now)
        if t > s.last_t:
            s.update(t)
        suspect, names = s.suspect, s.names
        nid = s.engine.by_name.get(step.node)
        # only the replicas on the step's node need their devices (the gate matches them to
        # the step's), as `k8s_serving` reads the holders of that node alone
        reps = tuple(
            Replica(p.name, names[p.node],
                    s.ids_of[p.slot] if p.node == nid else frozenset(),
                    ready=p.ready_at <= t and (p.node not in suspect or s.is_ready(p, t)))
            for p in s.pods.values()
        )  # fmt: skip
        # spare GPUs, counted up to what any step can ask for (its node's replicas and
        # the pool's shortfall): the gate's answer is the same, the count costs less
        cap = required(s.hpa, pool) - s.ready + 2 * s.slots_per_node
        spare = 0
        for n in s.nodes:
            if spare >= cap:
                break
            if n.id != nid and n.state is NodeState.UP:
                spare += sum(s.free(n, k) for k in range(s.slots_per_node))
        return PoolState(
            replicas=reps, demand=(Demand("hpa/serving", s.hpa, now),),
            desired=s.desired, spare_gpus=spare * s.gpr, mark=s.mark,
        )  # fmt: skip

    def scale_up(
        self, pool: ServingPool, *, to: int, added: int, node: str, state: PoolState, now: datetime
    ) -> ScaleMark:
        s = self.s
        s.mark = ScaleMark(node, added, state.desired, now)
        s.added += added
        s.update(self._t(now))
        return s.mark

    def restore(self, pool: ServingPool, state: PoolState) -> int:
        s = self.s
        s.added, s.mark = 0, None
        s.update(self.now())
        return s.desired


SERVING_READY, SERVING_DEMAND = 19, 20  # engine event kinds
