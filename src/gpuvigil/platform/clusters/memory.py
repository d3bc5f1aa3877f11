"""An in-memory cluster with virtual time: deterministic, with injectable faults and API errors.

Used by the controller's tests and benchmark, and by the simulator as its cluster. It keeps
the semantics that matter of the real adapters: gpuvigil's blocks are distinct from
everyone else's (a cordon, a foreign taint), evictions can be refused by a disruption budget
until the deadline, the node's agent answers a remediation request once per id after a
delay, a reboot changes the boot id, stores are optimistic (`Conflict` on a stale version),
and every call is counted (`calls`) so API calls per decision can be measured.

The "world" side (tests, simulator) uses `add_node`, `set_findings`, `cordon`, `fail_next`,
`advance` and friends; the controller uses only the `Cluster` methods. Preflight runs by
itself only on a new node (the `unvalidated` taint, as the DaemonSet's first pod does);
anywhere else only after `revalidate`, `preflight_s` later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary, HealthSummary, decode_health
from gpuvigil.platform.clusters.base import (
    AgentResult,
    ClusterError,
    Conflict,
    DrainStatus,
    Forbidden,
    NodeView,
    Preflight,
    Record,
    Unavailable,
)
from gpuvigil.platform.state import State, decode_record

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


@dataclass
class MemNode:
    name: str
    pool: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    faults: list[FindingSummary] = field(default_factory=list)
    fixed_by: Action | None = Action.RESET_GPU  # the least ladder step that clears the faults
    health_raw: str | None = None  # overrides the published summary (garbage tests)
    agent_alive: bool = True
    heartbeat_at: datetime | None = None
    record_raw: str | None = None
    our_taints: set[str] = field(default_factory=set)  # "unhealthy" | "unvalidated"
    other_blocks: set[str] = field(default_factory=set)  # "cordon", "taint:<key>", ...
    pods: list[Pod] = field(default_factory=list)
    evicted: list[Pod] = field(default_factory=list)
    request: tuple[str, Action, datetime] | None = None  # (id, action, due)
    answered: set[str] = field(default_factory=set)
    result: AgentResult | None = None
    preflight: Preflight | None = None
    preflight_asked: datetime | None = None  # when `revalidate` last started a fresh run
    released_at: datetime | None = None  # `mark_released`: what the agent would read
    boot: int = 0
    provider_id: str = ""  # the machine: a replacement is another one
    attributes: dict[str, str] = field(default_factory=dict)  # what nodeInfo would say
    version: int = 1
    events: list[tuple[datetime, str, str]] = field(default_factory=list)
    actions: list[tuple[str, str]] = field(default_factory=list)  # (op, detail) done to it


class MemoryCluster:
    """The `Cluster` interface over dicts; see the module docstring."""

    name = "memory"

    def __init__(
        self,
        *,
        clock: VirtualClock | None = None,
        reset_s: float = 30.0,
        reboot_s: float = 300.0,
        preflight_s: float = 60.0,
        auto_preflight: bool = True,
        replace_adds_node: bool = True,
    ) -> None:
        self.clock = clock or VirtualClock()
        self.nodes: dict[str, MemNode] = {}
        self.calls: Counter[str] = Counter()
        self.reset_s, self.reboot_s, self.preflight_s = reset_s, reboot_s, preflight_s
        self.auto_preflight = auto_preflight
        self.replace_adds_node = replace_adds_node
        self.replaced: list[str] = []
        self.machines = 0  # machines handed out so far (provider ids are unique)
        self._failures: list[list[object]] = []  # [op, node|None, error class, times]

    # ---- the world side -------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        pool: str = "default",
        labels: dict[str, str] | None = None,
        pods: int = 0,
        protected_pods: int = 0,
        unvalidated: bool = False,
        attributes: dict[str, str] | None = None,
    ) -> MemNode:
        self.machines += 1
        node = MemNode(name=name, pool=pool, labels=dict(labels or {}),
                       provider_id=f"memory:///machine-{self.machines}",
                       attributes=dict(attributes or {}))  # fmt: skip
        node.labels.setdefault("gpuvigil.io/pool", pool)
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
                node.heartbeat_at = now
            rec = decode_record(node.record_raw)
            if rec is None or rec.state is not State.VALIDATING or rec.since is None:
                continue
            # Like Kubernetes: a new node validates as it joins; on any other
            # node preflight runs again only when the controller asked (`revalidate`).
            started = rec.since if "unvalidated" in node.our_taints else None
            if node.preflight_asked is not None and node.preflight_asked >= rec.since:
                started = node.preflight_asked
            if (
                self.auto_preflight
                and started is not None
                and (now - started).total_seconds() >= self.preflight_s
                and (node.preflight is None or node.preflight.at < started)
            ):
                node.preflight = Preflight(passed=not node.faults, at=now)
                node.version += 1

    def summary(self, node: MemNode) -> HealthSummary:
        worst = Status.worst(f.status for f in node.faults)
        return HealthSummary(
            generated_at=node.heartbeat_at or self.clock.now(), status=worst, findings=node.faults
        )

    # ---- the Cluster interface ------------------------------------------------------

    def _call(self, op: str, name: str | None = None) -> MemNode | None:
        self.calls[op] += 1
        for entry in self._failures:
            f_op, f_node, error, times = entry
            if times and f_op in (op, "*") and (not f_node or f_node == name):
                entry[3] = int(times) - 1  # type: ignore[call-overload]
                self._failures = [e for e in self._failures if e[3]]
                raise error(f"injected {error.__name__} on {op}")  # type: ignore[operator]
        if name is None:
            return None
        node = self.nodes.get(name)
        if node is None:
            raise Forbidden(f"node {name} not found")
        return node

    def _view(self, node: MemNode) -> NodeView:
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
        )

    def list_nodes(self) -> list[NodeView]:
        self._call("list")
        return [self._view(n) for n in self.nodes.values()]

    def get_node(self, name: str) -> NodeView:
        node = self._call("get", name)
        assert node is not None
        return self._view(node)

    def block(self, name: str, *, reason: str) -> None:
        node = self._call("block", name)
        assert node is not None
        if "unhealthy" not in node.our_taints:
            node.our_taints.add("unhealthy")
            node.version += 1
            node.actions.append(("block", reason))

    def unblock(self, name: str) -> None:
        node = self._call("unblock", name)
        assert node is not None
        if node.our_taints:
            node.our_taints.clear()  # ours only: other_blocks are never touched
            node.version += 1
            node.actions.append(("unblock", ""))

    def drain(self, name: str, *, deadline: datetime, reason: str) -> DrainStatus:
        node = self._call("drain", name)
        assert node is not None
        past = self.clock.now() >= deadline
        kept, blocked, forced = [], 0, 0
        for pod in node.pods:
            if pod.protected and not past:
                kept.append(pod)
                blocked += 1
                continue
            forced += pod.protected
            pod.disruption_target = True
            node.evicted.append(pod)
        if len(kept) != len(node.pods):
            node.pods = kept
            node.version += 1
            node.actions.append(("drain", f"evicted, {len(kept)} left"))
        return DrainStatus(remaining=len(kept), blocked=blocked, forced=forced)

    def request(self, name: str, *, action: Action, request_id: str, gpus: list[int]) -> None:
        node = self._call("request", name)
        assert node is not None
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
        node = self._call("released", name)
        assert node is not None
        node.released_at = at
        node.version += 1

    def revalidate(self, name: str, *, since: datetime) -> int:
        node = self._call("revalidate", name)
        assert node is not None
        if node.preflight_asked is not None and node.preflight_asked >= since:
            return 0  # the fresh run for this validation is under way
        node.preflight_asked = self.clock.now()
        node.actions.append(("revalidate", ""))
        return 1

    def replace(self, name: str, *, reason: str) -> None:
        node = self._call("replace", name)
        assert node is not None
        del self.nodes[name]
        self.replaced.append(name)
        if self.replace_adds_node:  # like Karpenter / a node group: a fresh machine arrives
            self.add_node(name, pool=node.pool, labels=node.labels, unvalidated=True,
                          attributes=node.attributes)  # fmt: skip

    def store(self, name: str, record: Record, *, version: str = "") -> None:
        node = self._call("store", name)
        assert node is not None
        if version and version != str(node.version):
            raise Conflict(f"node {name} changed (have {version}, now {node.version})")
        text = record.encode()
        if text != node.record_raw:
            node.record_raw = text
            node.version += 1

    def record_event(self, name: str, *, reason: str, message: str, warning: bool = False) -> None:
        node = self._call("event", name)
        assert node is not None
        node.events.append((self.clock.now(), reason, message))
