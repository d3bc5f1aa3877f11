"""The simulated machines: state, active faults, the pool of free nodes (used by the engine).

A node is unavailable while it carries a hardware fault (found or not) or is out of
service (cordoned, draining, remediating); the fleet integrates that time so node
availability costs nothing per tick.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from gpuvigil.platform.state import POOL_LABEL, pool_of_labels
from gpuvigil.sim.faults import NODE_WIDE, Cause, Effect, FaultKind


class NodeState(StrEnum):
    UP = "up"  # schedulable (perhaps with a fault nobody has seen yet)
    CORDONED = "cordoned"  # no new work; waits for a person or the controller
    REPAIR = "repair"  # out of service: remediation, replacement or a person's repair
    DOWN = "down"  # the machine does not answer (the scheduler sees it)


@dataclass(eq=False)
class FaultInstance:
    id: int
    kind: FaultKind
    node: int
    onset_s: float
    gpu: int = 0  # the GPU it strikes (drawn by the fault model; node-wide faults ignore it)
    detected_s: float | None = None
    detected_by: str = ""
    repaired_s: float | None = None
    interrupted_job: bool = False
    fixed_by: object = None  # the least ladder step that cures this instance (layer 2)
    cleared_logged: bool = False  # the agent has reported its findings cleared
    on_arrival: bool = False  # a replacement arrived with it (struck while out of service)


@dataclass(eq=False)
class Node:
    id: int
    state: NodeState = NodeState.UP
    faults: list[FaultInstance] = field(default_factory=list)
    job: int | None = None  # job id
    unavailable_since: float | None = None
    hardware_faults: int = 0  # lifetime count, for repeat-offender replacement
    recovering: list[FaultInstance] = field(default_factory=list)  # fixed, not yet in service
    repair_epoch: int = 0
    last_step: str = "REPLACE"  # the repair under way (a person's repair: parts swapped)
    labels: dict[str, str] = field(default_factory=dict)  # pool, zone, rack, instance type
    facts: dict[str, str] = field(default_factory=dict)  # driver, kernel, OS image
    out: str = ""  # while out of service with no fault on the machine: "cordon" | "drain"
    broken_since: float | None = None  # schedulable with a fault that affects work, since
    # this machine's memory (a replacement is a new machine and starts afresh)
    quarantines: int = 0
    gpus_out: set[int] = field(default_factory=set)  # the device plugin's unhealthy GPUs
    swap_due: bool = False  # a person will swap its isolated GPU (sim.episodes)
    lemon: str = ""  # a lemon's fault kind: it returns after every repair (sim.scenarios)
    cleared: set[str] = field(default_factory=set)  # fault kinds repaired on this machine
    flaps: dict[str, int] = field(default_factory=dict)  # kind -> returns after service
    flapping_until: float = 0.0  # a flapping machine (sim.incidents) until then

    @property
    def name(self) -> str:
        return f"node-{self.id:05d}"

    @property
    def machine_fault(self) -> bool:
        """Something on the machine a repair cures (a missing tool or a bad driver image
        leaves the machine fine)."""
        return any(f.kind.on_machine for f in self.faults)

    @property
    def broken_in_service(self) -> bool:
        """Schedulable while carrying a fault that affects work (seen or not); a fault on a
        GPU the device plugin took out of allocatable reaches no new work (per-GPU
        isolation keeps the machine's other GPUs in service)."""
        return self.state is NodeState.UP and any(
            f.kind.persistent and f.kind.effect is not Effect.NONE
            and (f.kind.fault in NODE_WIDE or f.gpu not in self.gpus_out)
            for f in self.faults
        )  # fmt: skip

    def new_machine(self) -> None:
        """A replacement arrived: nothing of the old machine's history is its."""
        self.quarantines, self.lemon, self.flapping_until = 0, "", 0.0
        self.cleared, self.flaps = set(), {}

    @property
    def healthy(self) -> bool:
        """In service with no hardware fault (availability): a broken tool, even a hung one,
        leaves the node doing its work."""
        return self.state is NodeState.UP and all(
            f.kind.cause is Cause.TOOLING for f in self.faults
        )


# Every simulated machine runs this software until a storm's upgrade changes it.
BASE_FACTS = {"driver-version": "550.54.15", "kernel-version": "5.15.0-1051-aws",
              "os-image": "Ubuntu 22.04.4 LTS"}  # fmt: skip


def labels(
    i: int, *, pool_nodes: int, rack_nodes: int, pool_label: str = POOL_LABEL
) -> dict[str, str]:
    """A node's labels: pools of `pool_nodes` (each in one of three zones, its name in
    `pool_label`), racks of `rack_nodes`, one instance type."""
    pool = i // pool_nodes
    return {pool_label: f"pool-{pool}", "topology.kubernetes.io/zone": f"zone-{pool % 3}",
            "gpuvigil.io/rack": f"rack-{i // rack_nodes}",
            "node.kubernetes.io/instance-type": "p5.48xlarge"}  # fmt: skip


class Fleet:
    def __init__(
        self,
        size: int,
        rng: random.Random,
        *,
        pool_nodes: int = 64,
        rack_nodes: int = 4,
        pool_label: str = POOL_LABEL,
    ) -> None:
        self.pool_label = pool_label  # the controller's `safety.pool_label`
        self.nodes = [
            Node(i, labels=labels(i, pool_nodes=pool_nodes, rack_nodes=rack_nodes,
                                  pool_label=pool_label),
                 facts=dict(BASE_FACTS))
            for i in range(size)
        ]  # fmt: skip
        self._rng = rng
        self._free: list[int] = list(range(size))
        self._pos: dict[int, int] = {i: i for i in range(size)}
        self.unavailable_s = 0.0
        self.broken_in_service_s = 0.0
        self.serving: set[int] = set()  # nodes of the serving pool: no training job lands there
        self.on_change: Callable[[Node, float], None] | None = None  # sim.serving's update

    def serve(self, ids: Iterable[int]) -> None:
        """These nodes host the serving pool (`sim.serving`) from now on."""
        for nid in ids:
            self.serving.add(nid)
            self.remove_free(nid)

    # --- the free pool: O(1) add, remove and random pick ---------------------------------
    @property
    def free_count(self) -> int:
        return len(self._free)

    def add_free(self, nid: int) -> None:
        if nid in self._pos or nid in self.serving:
            return
        if self.nodes[nid].gpus_out:  # a gang's 8-GPU pod does not fit on 7 allocatable
            return
        self._pos[nid] = len(self._free)
        self._free.append(nid)

    def remove_free(self, nid: int) -> None:
        i = self._pos.pop(nid, None)
        if i is None:
            return
        last = self._free.pop()
        if last != nid:
            self._free[i] = last
            self._pos[last] = i

    def idle_by_pool(self, skip: Container[str]) -> Counter[str]:
        """The free nodes per pool, but those named in `skip` (the controller lists them
        itself): the room the controller's safety gate sees for moved work."""
        return Counter(pool_of_labels(self.nodes[i].labels, label=self.pool_label)
                       for i in self._free if self.nodes[i].name not in skip)  # fmt: skip

    def take(self, n: int) -> list[int]:
        picked = []
        for _ in range(n):
            nid = self._free[self._rng.randrange(len(self._free))]
            self.remove_free(nid)
            picked.append(nid)
        return picked

    def release(self, nid: int) -> None:
        node = self.nodes[nid]
        node.job = None
        if node.state is NodeState.UP:
            self.add_free(nid)

    # --- availability accounting ---------------------------------------------------------
    def mark(self, node: Node, t: float) -> None:
        """Call after any change to the node: opens or closes its unavailable interval."""
        broken = node.broken_in_service
        if broken and node.broken_since is None:
            node.broken_since = t
        elif not broken and node.broken_since is not None:
            self.broken_in_service_s += t - node.broken_since
            node.broken_since = None
        bad = not node.healthy
        if bad and node.unavailable_since is None:
            node.unavailable_since = t
        elif not bad and node.unavailable_since is not None:
            self.unavailable_s += t - node.unavailable_since
            node.unavailable_since = None
        if self.on_change is not None and node.id in self.serving:
            self.on_change(node, t)

    def close(self, t: float) -> None:
        for node in self.nodes:
            if node.broken_since is not None:
                self.broken_in_service_s += t - node.broken_since
                node.broken_since = t
            if node.unavailable_since is not None:
                self.unavailable_s += t - node.unavailable_since
                node.unavailable_since = t
