"""THE cluster interface: what the controller (and the simulator) may do to a cluster.

Three implementations: `kubernetes.KubernetesCluster`, `slurm.SlurmCluster` and
`memory.MemoryCluster` (deterministic, virtual time; the tests', the benchmark's and the
simulator's cluster). The controller (`platform.controller`) is the only caller. The same
tests run against all three (tests/integration/controller/test_contract.py).

Every write first asks the adapter's `fence` (set by the controller to its leader
elector's `fence`): it raises `Fenced` when this replica may no longer act, and otherwise
returns how many seconds are left before another replica could take over, which caps the
write's own timeout. Each adapter also offers `lease_store()`: the one object replicas
elect a leader and keep the disruption budget in (`platform.leader`, `platform.budget`).

Errors say what to do next (after controller-runtime / kopf): `Conflict` -> re-read the
node and retry; `Unavailable` -> retry later and act on nothing in the meantime;
`Forbidden` -> terminal for this operation (RBAC, a node that is gone). Every method is
idempotent: calling it twice has the effect of calling it once, which is what lets a
restarted controller redo the step it may or may not have finished.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from gpuvigil.core.findings import Action
from gpuvigil.platform.state import (
    AgentResult,
    Intent,
    NodeView,
    Preflight,
    Record,
    State,
)

__all__ = [
    "AgentResult",
    "Cluster",
    "ClusterError",
    "Conflict",
    "DrainStatus",
    "Fence",
    "Fenced",
    "Forbidden",
    "GpuEnforcement",
    "GpuIsolating",
    "Intent",
    "LeaseObject",
    "LeaseStore",
    "NodeView",
    "NotFound",
    "Preflight",
    "Record",
    "Sparing",
    "State",
    "Unavailable",
    "unfenced",
]


class ClusterError(Exception):
    """Base of the adapters' errors; `kind` labels gpuvigil_controller_api_errors_total."""

    kind = "error"


class Conflict(ClusterError):
    """The node changed since it was read (optimistic concurrency): re-read, retry."""

    kind = "conflict"


class Unavailable(ClusterError):
    """The cluster did not answer (timeout, 5xx, slurmctld down): retry later, act on nothing."""

    kind = "unavailable"


class Forbidden(ClusterError):
    """Terminal for this operation: no permission, the node no longer exists, bad request."""

    kind = "forbidden"


class NotFound(Forbidden):
    """The object does not exist (HTTP 404): terminal, and for a delete, already done."""


class Fenced(ClusterError):
    """This replica may not act now (it is not the leader, or its leadership may have
    lapsed): the write was not sent. Stop the pass; the next one starts from the level."""

    kind = "fenced"


Fence = Callable[[], float]


def unfenced() -> float:
    """The fence of a lone controller (no election): always free to act."""
    return math.inf


@dataclass(frozen=True)
class LeaseObject:
    """The election object as stored: a coordination.k8s.io Lease's `spec` (holderIdentity,
    leaseDurationSeconds, acquireTime, renewTime, leaseTransitions), its annotations (where
    the disruption budget lives) and the store's version token (changes on every write)."""

    spec: Mapping[str, Any]
    annotations: Mapping[str, str] = field(default_factory=dict)
    version: str = ""


class LeaseStore(Protocol):
    """Compare-and-swap storage of one `LeaseObject` (k8s: a Lease; Slurm: versioned files
    beside the StateSaveLocation; memory: a dict). Writes return the object written."""

    def get(self) -> LeaseObject | None: ...
    def create(self, spec: Mapping[str, Any], annotations: Mapping[str, str]) -> LeaseObject:
        """Conflict when it exists already."""
        ...

    def replace(
        self, spec: Mapping[str, Any], annotations: Mapping[str, str], *, version: str
    ) -> LeaseObject:
        """Conflict when it changed since `version` was read."""
        ...


@dataclass(frozen=True)
class DrainStatus:
    """Progress of moving running work off a node.

    `remaining` is work still running; `blocked` how much of it a PodDisruptionBudget
    refused to evict this time; `forced` how much was removed past the deadline, of which
    `past_budget` names the pods a PodDisruptionBudget had refused ("ns/name").
    """

    remaining: int
    blocked: int = 0
    forced: int = 0
    past_budget: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return self.remaining == 0


@dataclass(frozen=True)
class GpuEnforcement:
    """How the cluster keeps work off one GPU, when it is the cluster's own object and not
    the device plugin's allocatable (Kubernetes with DRA: a DeviceTaintRule). `enforced`:
    for a new isolation, the way is open; for a record, it stands. `holders`: from this
    way's own source (ResourceClaims), None when unknown. `device`: the DRA resource id."""

    scope: str  # `isolation.Scope`
    enforced: bool
    holders: list[str] | None
    device: str = ""
    why: str = ""


@runtime_checkable
class GpuIsolating(Protocol):
    """What a cluster that can take one GPU out of service offers besides `Cluster`
    (Kubernetes with the device plugin; docs/controller.md "Per-GPU isolation"). The
    controller takes the per-GPU path only on an adapter that has these.

    Optional (Slurm's degraded node, `clusters.slurm_degrade`): `isolation_scope`
    (`isolation.Scope`, default "device-plugin"); `gpu_reset_supported` (default True);
    `gpu_enforced(node) -> bool` (default: allocatable below capacity); and
    `converge_isolation(name, text)`, called after every pass of the GPU's ladder to make
    the node match the record as stored (a record: degrade; none: restore).

    Optional (Kubernetes with DRA, `clusters.k8s_dra`): `gpu_enforcement(node, gpu_uuid,
    *, plugin_agrees, record) -> GpuEnforcement | None` (None: the default way);
    `enforce_gpu(name, record) -> str`, called once the record of a new isolation is
    stored and before any eviction ("" done, else why not: the node goes to its whole
    ladder); `release_gpu(name, record)`, called before a record is deleted."""

    def gpu_holders(self, name: str, gpu_uuid: str) -> list[str] | None:
        """The pods ("ns/name") holding that GPU now; None when that cannot be known."""
        ...

    def evict(self, name: str, pods: list[str], *, deadline: datetime, reason: str) -> DrainStatus:
        """Move those pods off the node as `drain` does (Eviction API, PDBs honoured, what
        is left removed past `deadline`); the node is not blocked."""
        ...

    def store_isolation(self, name: str, text: str | None) -> None:
        """Write the node's isolation record (`platform.isolation`); None deletes it."""
        ...


@runtime_checkable
class Sparing(Protocol):
    """What a cluster that can keep hot spares offers besides `Cluster` (`platform.spares`;
    docs/controller.md "Hot spares"): the controller keeps spares only on an adapter that
    has these. A spare is shown as `NodeView.spare`, and its running work as
    `NodeView.running` (counted for every spare, so a used one is seen)."""

    def make_spare(self, name: str) -> bool:
        """Keep ordinary work off the node and let gang jobs' replacements on (k8s: the
        `gpuvigil.io/spare` label and `gpuvigil.io/spare:NoSchedule` taint; Slurm: add it
        to the spare reservation). Only while it holds no work, checked at the cluster
        just before: False (nothing written) when it does."""
        ...

    def unmake_spare(self, name: str) -> None:
        """The node is an ordinary one again (both marks removed); idempotent."""
        ...


@runtime_checkable
class Cluster(Protocol):
    """The one interface to a cluster. Names are node names; reasons are for people."""

    name: str  # "kubernetes" | "slurm" | "memory"
    fence: Fence  # asked before every write; see the module docstring
    # Optional: `max_concurrency` (int, default 1): how many nodes the controller may act on
    # at once. The memory cluster keeps 1 so that runs stay deterministic.
    # Optional: `replace_removes_node` (bool, default False): `replace` deletes the node
    # object (k8s delete-node), so the controller reports it REMOVED (`core.states`).

    def lease_store(self) -> LeaseStore:
        """Where replicas elect a leader and keep the disruption budget."""
        ...

    def list_nodes(self) -> list[NodeView]:
        """Every node with its health summary, stored record, blocks and running work."""
        ...

    def get_node(self, name: str) -> NodeView:
        """One node (raises Forbidden when it does not exist)."""
        ...

    def block(self, name: str, *, reason: str) -> None:
        """Keep new work off (k8s taint gpuvigil.io/unhealthy:NoSchedule; Slurm DRAIN)."""
        ...

    def unblock(self, name: str) -> None:
        """Lift gpuvigil's own blocks (both taints); never anyone else's."""
        ...

    def drain(self, name: str, *, deadline: datetime, reason: str) -> DrainStatus:
        """Move running work off, honouring disruption budgets until `deadline`, then
        removing what is left (marked as an infrastructure disruption). Call repeatedly."""
        ...

    def request(self, name: str, *, action: Action, request_id: str, gpus: list[int]) -> None:
        """Ask the node's agent (or the scheduler) for RESET_GPU or REBOOT, once per id."""
        ...

    def revalidate(self, name: str, *, since: datetime) -> int:
        """Have preflight run again on a VALIDATING node, so that a result newer than
        `since` (the start of validation) comes. k8s: delete the node's preflight pods
        created before `since` (the DaemonSet starts a fresh one, which runs preflight);
        pods created since are that fresh run and are kept, which makes a repeat harmless.
        Slurm: nothing (no preflight channel). Returns how many runs were started."""
        ...

    def mark_released(self, name: str, *, at: datetime) -> None:
        """Tell the node's agent a person released the node at `at` (`gpuvigil release`),
        so it forgets the Xid events it kept across reboots. k8s: the Node annotation
        `core.wire.RELEASED_ANNOTATION`; Slurm: nothing reaches the agent (docs/agent.md:
        write `<state_dir>/released-at` on the node)."""
        ...

    def replace(self, name: str, *, reason: str) -> None:
        """Give the node back for replacement (k8s: delete the Node, or a hook command)."""
        ...

    def store(self, name: str, record: Record, *, version: str = "", block: bool = False) -> None:
        """Write gpuvigil's record onto the node; `version` non-empty -> Conflict if the
        node changed since that read (`NodeView.version`). `block`: also keep new work off,
        in the same write where the cluster allows (one API call instead of two)."""
        ...

    def record_event(self, name: str, *, reason: str, message: str, warning: bool = False) -> None:
        """A human-readable event on the node (k8s Event; Slurm: the controller's log)."""
        ...

    def publish(self, name: str, intent: Intent) -> None:
        """Put the controller's latest decision on the node for people (`gpuvigil nodes`;
        k8s: the annotation `state.INTENT_ANNOTATION`). Never read by the policy, so a
        dry-run controller writes it too. Where `NodeView.intent_supported` is False
        (Slurm: no node field is free) the controller does not call it."""
        ...
