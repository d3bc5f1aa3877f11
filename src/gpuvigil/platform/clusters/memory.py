"""An in-memory cluster with virtual time: deterministic, with injectable faults and API errors.

Used by the controller's tests and benchmark, and by the simulator as its cluster. It keeps
the semantics that matter of the real adapters: gpuvigil's blocks are distinct from
everyone else's (a cordon, a foreign taint), evictions can be refused by a disruption budget
until the deadline, the node's agent answers a remediation request once per id after a
delay, a reboot changes the boot id, stores are optimistic (`Conflict` on a stale version),
and every call is counted (`calls`) so API calls per decision can be measured. Writes ask
`fence` first, and `lease_store()` is an in-memory Lease (compare-and-swap on a version)
that several controllers over one `MemoryCluster` share: the split-brain tests and the
simulator's `split-brain` scenario elect over it.

The "world" side (tests, simulator) uses `add_node`, `set_findings`, `cordon`, `fail_next`,
`advance`, `mark_gpu` (the device plugin takes a GPU out of allocatable; `Pod.gpu` is the
GPU a pod holds) and friends; the controller uses only the `Cluster` methods. Preflight runs by
itself only on a new node (the `unvalidated` taint, as the DaemonSet's first pod does);
anywhere else only after `revalidate`, `preflight_s` later.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary, HealthSummary, decode_health
from gpuvigil.platform.clusters.base import (
    AgentResult,
    ClusterError,
    Conflict,
    DrainStatus,
    Fence,
    Forbidden,
    LeaseObject,
    NodeView,
    Preflight,
    Record,
    Unavailable,
    unfenced,
)
from gpuvigil.platform.state import (
    DEFAULT_POOL,
    POOL_LABEL,
    Intent,
    State,
    decode_intent,
    decode_record,
)

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class VirtualClock:
    """Time that moves only when told to; `now()` is what the controller is given."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)


@dataclass
class Pod:
    name: str
    protected: bool = False  # a disruption budget refuses its eviction
    disruption_target: bool = False  # evicted because of a node fault
    gpu: str = ""  # the uuid of the GPU it holds (what PodResources would say), if any


@dataclass
class MemNode:
    name: str
    pool: str = DEFAULT_POOL
    labels: dict[str, str] = field(default_factory=dict)
    faults: list[FindingSummary] = field(default_factory=list)
    fixed_by: Action | None = Action.RESET_GPU  # the least ladder step that clears the faults
    health_raw: str | None = None  # overrides the published summary (garbage tests)
    agent_alive: bool = True
    heartbeat_at: datetime | None = None
    record_raw: str | None = None
    intent_raw: str | None = None  # what `publish` wrote (the k8s intent annotation)
    our_taints: set[str] = field(default_factory=set)  # "unhealthy" | "unvalidated"
    other_blocks: set[str] = field(default_factory=set)  # "cordon", "taint:<key>", ...
    pods: list[Pod] = field(default_factory=list)
    evicted: list[Pod] = field(default_factory=list)
    request: tuple[str, Action, datetime] | None = None  # (id, action, due)
    answered: set[str] = field(default_factory=set)
    result: AgentResult | None = None
    preflight: Preflight | None = None
    preflight_asked: datetime | None = None  # when `revalidate` last started a fresh run
    # ... and for which validation (its `since`, on the controller's clock): like the
    # Kubernetes adapter's pod name, a key, never compared with this cluster's clock
    preflight_for: datetime | None = None
    released_at: datetime | None = None  # `mark_released`: what the agent would read
    boot: int = 0
    provider_id: str = ""  # the machine: a replacement is another one
    attributes: dict[str, str] = field(default_factory=dict)  # what nodeInfo would say
    version: int = 1
    events: list[tuple[datetime, str, str]] = field(default_factory=list)
    actions: list[tuple[str, str]] = field(default_factory=list)  # (op, detail) done to it
    # Per-GPU isolation (`clusters.base.GpuIsolating`): the GPUs the device plugin
    # registers (0: unknown, the node has no GPU resource), the ones it marked unhealthy
    # (out of allocatable), whether the agent's pod->GPU mapping is known, and the stored
    # isolation record.
    gpus: int = 0
    gpus_out: set[int] = field(default_factory=set)
    holders_known: bool = True
    isolation_raw: str | None = None
    spare: bool = False  # a hot spare (`Sparing`): only gang work lands on it


class MemoryLease:
    """An in-memory `LeaseStore`: the version changes on every write; calls are counted
    (and can be made to fail) through the cluster, as `lease_get` / `lease_write`."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster
        self.obj: LeaseObject | None = None
        self._rv = 0

    def get(self) -> LeaseObject | None:
        self.cluster._call("lease_get")
        return self.obj

    def _write(self, spec: Mapping[str, Any], annotations: Mapping[str, str]) -> LeaseObject:
        self._rv += 1
        self.obj = LeaseObject(dict(spec), dict(annotations), str(self._rv))
        return self.obj

    def create(self, spec: Mapping[str, Any], annotations: Mapping[str, str]) -> LeaseObject:
        self.cluster._call("lease_write")
        if self.obj is not None:
            raise Conflict("the lease exists")
        return self._write(spec, annotations)

    def replace(
        self, spec: Mapping[str, Any], annotations: Mapping[str, str], *, version: str
    ) -> LeaseObject:
        self.cluster._call("lease_write")
        if self.obj is None or self.obj.version != version:
            raise Conflict(f"the lease changed since version {version}")
        return self._write(spec, annotations)


class MemoryCluster:
    """The `Cluster` interface over dicts; see the module docstring."""

    name = "memory"
    fence: Fence = staticmethod(unfenced)

    def __init__(
        self,
        *,
        clock: VirtualClock | None = None,
        reset_s: float = 30.0,
        reboot_s: float = 300.0,
        preflight_s: float = 60.0,
        auto_preflight: bool = True,
        replace_adds_node: bool = True,
        heartbeat_s: float = 0.0,
        pool_label: str = POOL_LABEL,
    ) -> None:
        self.clock = clock or VirtualClock()
        self.pool_label = pool_label  # the label add_node writes each node's pool to
        self.nodes: dict[str, MemNode] = {}
        self.calls: Counter[str] = Counter()
        self.reset_s, self.reboot_s, self.preflight_s = reset_s, reboot_s, preflight_s
        self.auto_preflight = auto_preflight
        # What a node's preflight run says (True: passed). None: it passes when no published
        # fault remains; the simulator sets the real verdict over what is left on the
        # machine, which sees what no agent has published yet (silent corruption).
        self.preflight_judge: Callable[[MemNode], bool] | None = None
        # A live agent publishes every `heartbeat_s` (0: at every `advance`), as the real
        # one does every interval: between beats its node does not change.
        self.heartbeat_s = heartbeat_s
        self.replace_adds_node = replace_adds_node
        self.replaced: list[str] = []
        self.machines = 0  # machines handed out so far (provider ids are unique)
        self._failures: list[list[object]] = []  # [op, node|None, error class, times]
        self.lease = MemoryLease(self)
        self._views: dict[str, tuple[tuple[object, ...], NodeView]] = {}

    # ---- the world side -------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        pool: str = DEFAULT_POOL,
        labels: dict[str, str] | None = None,
        pods: int = 0,
        protected_pods: int = 0,
        unvalidated: bool = False,
        attributes: dict[str, str] | None = None,
        gpus: int = 0,
    ) -> MemNode:
        self.machines += 1
        node = MemNode(name=name, pool=pool, labels=dict(labels or {}),
                       provider_id=f"memory:///machine-{self.machines}",
                       attributes=dict(attributes or {}), gpus=gpus)  # fmt: skip
        node.labels.setdefault(self.pool_label, pool)
        node.pods = [Pod(f"{name}-p{i}") for i in range(pods)]
        node.pods += [Pod(f"{name}-pdb{i}", protected=True) for i in range(protected_pods)]
        if unvalidated:
            node.our_taints.add("unvalidated")
        node.heartbeat_at = self.clock.now()
        self.nodes[name] = node
        return node

    def set_findings(
        self,
        name: str,
        findings: list[FindingSummary],
        *,
        fixed_by: Action | None = Action.RESET_GPU,
    ) -> None:
        """Put faults on a node; they clear when a step >= `fixed_by` runs (None: never)."""
        node = self.nodes[name]
        node.faults, node.fixed_by = list(findings), fixed_by
        node.heartbeat_at = self.clock.now()
        node.version += 1

    def clear_findings(self, name: str) -> None:
        self.set_findings(name, [])

    def set_health_raw(self, name: str, text: str | None) -> None:
        """Publish exactly `text` as the node's summary (None: absent; garbage: unreadable)."""
        self.nodes[name].health_raw = text
        self.nodes[name].version += 1

    def cordon(self, name: str, who: str = "cordon") -> None:
        self.nodes[name].other_blocks.add(who)
        self.nodes[name].version += 1

    def uncordon(self, name: str, who: str = "cordon") -> None:
        self.nodes[name].other_blocks.discard(who)
        self.nodes[name].version += 1

    def fail_next(
        self, op: str, error: type[ClusterError] = Unavailable, *, times: int = 1, node: str = ""
    ) -> None:
        """Make the next `times` calls of `op` ("*" for any; on `node` if given) raise."""
        self._failures.append([op, node, error, times])

    def advance(self, seconds: float) -> None:
        """Move virtual time; agents answer due requests, live agents publish, preflight runs."""
        self.clock.advance(seconds)
        now = self.clock.now()
        for node in list(self.nodes.values()):
            if node.request is not None and node.request[2] <= now:
                rid, action, _ = node.request
                node.request = None
                fixed = node.fixed_by is not None and action.rank >= node.fixed_by.rank
                if fixed:
                    node.faults = []
                if action is Action.REBOOT:
                    node.boot += 1
                node.result = AgentResult(rid, succeeded=True, at=now, detail=action.value)
                node.version += 1
            if node.agent_alive:
                node.heartbeat_at = self._beat(node.heartbeat_at, now)
            rec = decode_record(node.record_raw)
            if rec is None or rec.state is not State.VALIDATING or rec.since is None:
                continue
            # Like Kubernetes: a new node validates as it joins; on any other
            # node preflight runs again only when the controller asked (`revalidate`).
            started = rec.since if "unvalidated" in node.our_taints else None
            if node.preflight_for == rec.since and node.preflight_asked is not None:
                started = node.preflight_asked
            if (
                self.auto_preflight
                and started is not None
                and (now - started).total_seconds() >= self.preflight_s
                and (node.preflight is None or node.preflight.at < started)
            ):
                judge = self.preflight_judge
                passed = judge(node) if judge is not None else not node.faults
                node.preflight = Preflight(passed=passed, at=now, for_since=rec.since)
                node.version += 1

    def _beat(self, last: datetime | None, now: datetime) -> datetime:
        """The time of the agent's latest publish at `now`."""
        if not self.heartbeat_s or last is None:
            return now
        beats = int((now - last).total_seconds() // self.heartbeat_s)
        return last + timedelta(seconds=beats * self.heartbeat_s)

    def summary(self, node: MemNode) -> HealthSummary:
        worst = Status.worst(f.status for f in node.faults)
        # the findings are FindingSummary already: no need to validate them again
        return HealthSummary.model_construct(
            v=1,
            generated_at=node.heartbeat_at or self.clock.now(),
            status=worst,
            findings=list(node.faults),
            truncated=0,
        )

    # ---- the Cluster interface ------------------------------------------------------

    def _call(self, op: str, name: str | None = None) -> MemNode | None:
        self.calls[op] += 1
        for entry in self._failures:
            f_op, f_node, error, times = entry
            if times and f_op in (op, "*") and (not f_node or f_node == name):
                entry[3] = int(times) - 1  # type: ignore[call-overload]
                self._failures[:] = [e for e in self._failures if e[3]]  # shared by replicas
                raise error(f"injected {error.__name__} on {op}")  # type: ignore[operator]
        if name is None:
            return None
        node = self.nodes.get(name)
        if node is None:
            raise Forbidden(f"node {name} not found")
        return node

    def _write(self, op: str, name: str) -> MemNode:
        """A write: the fence first (a fenced controller sends nothing), then the call."""
        self.fence()
        node = self._call(op, name)
        assert node is not None
        return node

    def lease_store(self) -> MemoryLease:
        return self.lease

    def replica(self) -> MemoryCluster:
        """Another controller's handle on this same cluster: shares every node, the
        clock, the call counts and the Lease, and has its own `fence`."""
        return copy.copy(self)

    def _view(self, node: MemNode) -> NodeView:
        """Built again only when something it shows changed (the simulator lists the same
        nodes pass after pass)."""
        key = (node.version, node.heartbeat_at, len(node.pods), node.record_raw, node.health_raw,
               node.intent_raw)  # fmt: skip
        hit = self._views.get(node.name)
        if hit is not None and hit[0] == key:
            return hit[1]
        view = self._build_view(node)
        self._views[node.name] = (key, view)
        return view

    def _build_view(self, node: MemNode) -> NodeView:
        if node.health_raw is not None:
            health = decode_health(node.health_raw)
            health_error = None if health else ("absent" if not node.health_raw else "unreadable")
            heartbeat = health.generated_at if health else None
        else:
            health, health_error = self.summary(node), None
            heartbeat = node.heartbeat_at
        record = decode_record(node.record_raw)
        return NodeView(
            name=node.name,
            pool=node.pool,
            labels=dict(node.labels),
            health=health,
            health_error=health_error,
            heartbeat_at=heartbeat,
            record=record,
            record_error="unreadable" if node.record_raw and record is None else None,
            blocked_by_us="unhealthy" in node.our_taints,
            blocked_by_others=tuple(sorted(node.other_blocks)),
            unvalidated="unvalidated" in node.our_taints,
            running=len(node.pods),
            preflight=node.preflight,
            agent_result=node.result,
            boot_id=f"boot-{node.boot}",
            provider_id=node.provider_id,
            version=str(node.version),
            attributes=dict(node.attributes),
            intent=decode_intent(node.intent_raw),
            gpu_capacity=node.gpus or None,
            gpu_allocatable=max(0, node.gpus - len(node.gpus_out)) if node.gpus else None,
            isolation_text=node.isolation_raw,
            spare=node.spare,
        )

    def list_nodes(self) -> list[NodeView]:
        self._call("list")
        return [self._view(n) for n in self.nodes.values()]

    def get_node(self, name: str) -> NodeView:
        node = self._call("get", name)
        assert node is not None
        return self._view(node)

    def block(self, name: str, *, reason: str) -> None:
        node = self._write("block", name)
        if "unhealthy" not in node.our_taints:
            node.our_taints.add("unhealthy")
            node.version += 1
            node.actions.append(("block", reason))

    def unblock(self, name: str) -> None:
        node = self._write("unblock", name)
        if node.our_taints:
            node.our_taints.clear()  # ours only: other_blocks are never touched
            node.version += 1
            node.actions.append(("unblock", ""))

    def make_spare(self, name: str) -> bool:
        node = self._write("make_spare", name)
        if node.pods:  # work landed since the list: not idle, nothing written
            return False
        if not node.spare:
            node.spare = True
            node.version += 1
            node.actions.append(("make_spare", ""))
        return True

    def unmake_spare(self, name: str) -> None:
        node = self._write("unmake_spare", name)
        if node.spare:
            node.spare = False
            node.version += 1
            node.actions.append(("unmake_spare", ""))

    def drain(self, name: str, *, deadline: datetime, reason: str) -> DrainStatus:
        node = self._write("drain", name)
        st, moved = self._move(node, None, past=self.clock.now() >= deadline)
        if moved:
            node.actions.append(("drain", f"evicted, {st.remaining} left"))
        return st

    def _move(
        self, node: MemNode, named: set[str] | None, *, past: bool
    ) -> tuple[DrainStatus, bool]:
        """Evict the pods `named` (None: all), a disruption budget's only `past` the
        deadline; and whether any pod moved. `remaining`: the named pods left."""
        kept, blocked, forced = [], 0, 0
        for pod in node.pods:
            if named is not None and pod.name not in named:
                kept.append(pod)
            elif pod.protected and not past:
                kept.append(pod)
                blocked += 1
            else:
                forced += pod.protected
                pod.disruption_target = True
                node.evicted.append(pod)
        left = blocked if named is not None else len(kept)
        st = DrainStatus(remaining=left, blocked=blocked, forced=forced)
        if len(kept) == len(node.pods):
            return st, False
        node.pods = kept
        node.version += 1
        return st, True

    # ---- one GPU (clusters.base.GpuIsolating) ------------------------------------------

    def mark_gpu(self, name: str, index: int, *, out: bool = True) -> None:
        """World side: the device plugin marks GPU `index` unhealthy (`out`) or, as after a
        plugin restart, healthy again."""
        node = self.nodes[name]
        (node.gpus_out.add if out else node.gpus_out.discard)(index)
        node.version += 1

    def gpu_holders(self, name: str, gpu_uuid: str) -> list[str] | None:
        node = self._call("gpu_holders", name)
        assert node is not None
        if not node.holders_known:
            return None
        return sorted(p.name for p in node.pods if p.gpu == gpu_uuid)

    def evict(self, name: str, pods: list[str], *, deadline: datetime, reason: str) -> DrainStatus:
        node = self._write("evict", name)
        st, moved = self._move(node, set(pods), past=self.clock.now() >= deadline)
        if moved:
            node.actions.append(("evict", reason))
        return st

    def store_isolation(self, name: str, text: str | None) -> None:
        node = self._write("store_isolation", name)
        if text != node.isolation_raw:
            node.isolation_raw = text
            node.version += 1
            node.actions.append(("isolation", "stored" if text else "deleted"))

    def request(self, name: str, *, action: Action, request_id: str, gpus: list[int]) -> None:
        node = self._write("request", name)
        if action not in (Action.RESET_GPU, Action.REBOOT):
            raise Forbidden(f"the agent cannot {action.value}")
        if request_id in node.answered or (node.request and node.request[0] == request_id):
            return  # the agent acts once per id
        node.answered.add(request_id)
        delay = self.reset_s if action is Action.RESET_GPU else self.reboot_s
        node.request = (request_id, action, self.clock.now() + timedelta(seconds=delay))
        node.version += 1
        node.actions.append(("request", f"{action.value} {request_id}"))

    def mark_released(self, name: str, *, at: datetime) -> None:
        node = self._write("released", name)
        node.released_at = at
        node.version += 1

    def revalidate(self, name: str, *, since: datetime) -> int:
        node = self._write("revalidate", name)
        if node.preflight_for == since:
            return 0  # the fresh run for this validation is under way
        node.preflight_asked, node.preflight_for = self.clock.now(), since
        node.actions.append(("revalidate", ""))
        return 1

    def replace(self, name: str, *, reason: str) -> None:
        node = self._write("replace", name)
        del self.nodes[name]
        self.replaced.append(name)
        if self.replace_adds_node:  # like Karpenter / a node group: a fresh machine arrives
            self.add_node(name, pool=node.pool, labels=node.labels, unvalidated=True,
                          attributes=node.attributes, gpus=node.gpus)  # fmt: skip

    def store(self, name: str, record: Record, *, version: str = "", block: bool = False) -> None:
        node = self._write("store", name)
        if version and version != str(node.version):
            raise Conflict(f"node {name} changed (have {version}, now {node.version})")
        text = record.encode()
        changed = text != node.record_raw
        node.record_raw = text
        if block and "unhealthy" not in node.our_taints:
            node.our_taints.add("unhealthy")
            node.actions.append(("block", record.tag()))
            changed = True
        if changed:
            node.version += 1

    def publish(self, name: str, intent: Intent) -> None:
        node = self._write("publish", name)
        text = intent.encode()
        if text != node.intent_raw:
            node.intent_raw = text
            node.version += 1

    def record_event(self, name: str, *, reason: str, message: str, warning: bool = False) -> None:
        node = self._write("event", name)
        node.events.append((self.clock.now(), reason, message))
