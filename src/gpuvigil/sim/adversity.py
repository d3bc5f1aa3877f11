"""The simulator attacks the controller: `split-brain` and `api-outage` (sim.platform).

Both run the real `platform.controller.Controller` and the real `platform.leader` election
over the in-memory cluster (`clusters.memory`), in virtual time, and report what they saw
in `Results.adversity`:

- `api-outage`: the API server is down for `length_s` (30 min) from mid-run: every call the
  controller makes raises `Unavailable` (it acts on nothing it could not read, and retries
  every `retry_s`), and the agents cannot publish, so their heartbeats stop until it is
  back. People and the machines themselves still act (a release, a replacement arriving).
- `split-brain`: two replicas over one cluster and one Lease; replica `b`'s wall clock is
  `skew_s` ahead (its controller's clock too). Every `pause_every_s` the leader stalls for
  `pause_s` between reading the node list and writing (in the first pass after an agent
  published news, so the stalled pass has something to write) (a GC pause, SIGSTOP, a starved
  VM), while the standby keeps looking every `retry_s`; the stalled replica then resumes
  its pass on the list it read before. Each write the fence lets through is checked
  against the Lease's holder at that instant, and after every pass the budget in use is
  compared with the pool's limit.

Elections tick at each controller pass (the holder first: between passes the real leader
renews every `retry_s`, so a standby must not see a long gap as silence) and every
`retry_s` while a leader is stalled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpuvigil.platform.clusters.base import Fenced, Unavailable
from gpuvigil.platform.controller import Controller, PassResult
from gpuvigil.platform.leader import LeaderElector, LeaseSettings

if TYPE_CHECKING:
    from gpuvigil.sim.platform import SimCluster

HOUR = 3600.0


@dataclass(frozen=True)
class ApiOutage:
    start_s: float = 15 * 86400.0  # ATTACKS: mid-run
    length_s: float = 1800.0  # the 30 minutes
    retry_s: float = 60.0


@dataclass(frozen=True)
class SplitBrain:
    skew_s: float = 20.0  # the skew
    pause_every_s: float = 6 * HOUR
    pause_s: float = 40.0  # longer than the 15 s lease: the standby takes over meanwhile


# scenario attack -> its settings for a run of `horizon_s` seconds
ATTACKS: dict[str, Callable[[float], ApiOutage | SplitBrain]] = {
    "api-outage": lambda horizon_s: ApiOutage(start_s=horizon_s / 2),  # mid-run
    "split-brain": lambda horizon_s: SplitBrain(),
}


class Outage:
    """`api-outage` on one cluster: wraps its calls and its agents' heartbeats."""

    def __init__(self, cluster: SimCluster, spec: ApiOutage, now: Callable[[], float]) -> None:
        self.spec, self.now = spec, now
        self.counts: Counter[str] = Counter()
        call = cluster._call

        def guarded(op: str, name: str | None = None) -> Any:
            if self.down() and cluster.controller_calling:
                self.counts["refused_calls"] += 1
                raise Unavailable("the API server is down (api-outage)")
            return call(op, name)

        cluster._call = guarded  # type: ignore[method-assign]
        cluster.agents_silent = self.down

    def down(self) -> bool:
        t = self.now()
        return self.spec.start_s <= t < self.spec.start_s + self.spec.length_s

    def passed(self, result: PassResult) -> None:
        self.counts["passes_during_outage" if self.down() else "passes"] += 1
        if not result.listed:
            self.counts["failed_passes"] += 1

    def wake(self, t: float) -> float | None:
        """A pass when the outage starts, every `retry_s` during it, and when it ends."""
        end = self.spec.start_s + self.spec.length_s
        if t < self.spec.start_s:
            return self.spec.start_s
        if t < end:
            return min(t + self.spec.retry_s, end)
        return None

    def report(self) -> dict[str, Any]:
        return {"outage_s": self.spec.length_s, **dict(sorted(self.counts.items()))}


class Replicas:
    """`split-brain`: two controllers and their electors over one cluster."""

    def __init__(
        self,
        cluster: SimCluster,
        *,
        make: Callable[..., Controller],
        settings: LeaseSettings,
        spec: SplitBrain,
        limits: dict[str, int],
        now: Callable[[], float],
    ) -> None:
        self.spec, self.now, self.limits = spec, now, limits
        self.cluster = cluster
        self.counts: Counter[str] = Counter()
        self.worst_over = 0
        clock = cluster.clock.now
        self.ctl: dict[str, Controller] = {}
        self.electors: dict[str, LeaderElector] = {}
        for ident, skew in (("a", 0.0), ("b", spec.skew_s)):
            c = cluster if ident == "a" else cluster.replica()
            wall = (lambda s=skew: clock() + timedelta(seconds=s)) if skew else clock
            el = LeaderElector(
                c.lease_store(), identity=ident, settings=settings, wall=wall, monotonic=now
            )
            ctl = make(c, clock=wall, identity=ident, elector=el, monotonic=now)
            c.fence = self._checked(ident, el)  # after the controller set the elector's
            self.ctl[ident], self.electors[ident] = ctl, el
        self.stalled: tuple[str, float, list[Any]] | None = None  # who, since, list read
        self.news = False  # an agent published since the last round (sim.platform)
        self.next_pause = spec.pause_every_s

    def _checked(self, ident: str, el: LeaderElector) -> Callable[[], float]:
        """The elector's fence, and a witness: a write it lets through must come from the
        Lease's holder of that instant."""

        def fence() -> float:
            try:
                left = el.fence()
            except Fenced:
                self.counts["fenced_writes"] += 1
                raise
            lease = el.store.obj  # type: ignore[attr-defined]  (MemoryLease: no call counted)
            if lease is None or lease.spec.get("holderIdentity") != ident:
                self.counts["writes_by_non_holder"] += 1
            return left

        return fence

    def holder(self) -> str:
        lease = self.cluster.lease.obj
        return str(lease.spec.get("holderIdentity") or "") if lease else ""

    def tick(self) -> None:
        """Both electors look (the holder first); a stalled replica does nothing."""
        before = self.holder()
        order = sorted(self.electors, key=lambda i: i != before)
        for ident in order:
            if self.stalled is None or self.stalled[0] != ident:
                self.electors[ident].try_acquire_or_renew()
        after = self.holder()
        if before and after and after != before:
            self.counts["leader_changes"] += 1

    def reconcile(self) -> list[PassResult]:
        """One round: elections, the stall's start or end, and a pass by whoever leads."""
        t = self.now()
        results: list[PassResult] = []
        self.tick()
        if self.stalled is not None and t >= self.stalled[1] + self.spec.pause_s:
            results.append(self._resume())
        if self.stalled is None and t >= self.next_pause and self.news:
            leader = self.holder()
            if leader:  # it read the list with the news, then stopped before writing
                self.stalled = (leader, t, self.ctl[leader].cluster.list_nodes())
                self.counts["stalls"] += 1
            self.next_pause = t + self.spec.pause_every_s
        self.news = False
        for ident, ctl in self.ctl.items():
            stalled = self.stalled is not None and self.stalled[0] == ident
            if not stalled and self.electors[ident].is_leader():
                results.append(ctl.reconcile())
                self.counts[f"passes_{ident}"] += 1
        self._audit()
        return results

    def _resume(self) -> PassResult:
        """The stalled replica finishes the pass it began: the list from before the stall,
        the fence it passed before the stall; every write asks the fence again now."""
        assert self.stalled is not None
        ident, _, listed = self.stalled
        self.stalled = None
        ctl = self.ctl[ident]
        cluster, fence = ctl.cluster, ctl.cluster.fence
        asked: list[bool] = []

        def first_passes() -> float:
            if not asked:
                asked.append(True)
                return self.spec.pause_s  # the check it made before the stall
            return fence()

        cluster.fence, cluster.list_nodes = first_passes, lambda: listed  # type: ignore[method-assign]
        try:
            result = ctl.reconcile()
        finally:
            cluster.fence = fence
            del cluster.list_nodes  # the class's again
        self.counts["resumed_passes"] += 1
        self.counts["resumed_passes_fenced"] += int(result.fenced)
        return result

    def _audit(self) -> None:
        """Nodes in the budget by their records, per pool, against the pool's limit."""
        in_budget: Counter[str] = Counter()
        for name in self.cluster.active:
            node = self.cluster.nodes.get(name)
            if node is not None and (rec := self.cluster._view(node).record) is not None:
                in_budget[node.pool] += rec.in_budget
        for pool, n in in_budget.items():
            self.worst_over = max(self.worst_over, n - self.limits.get(pool, 0))

    def wake(self, t: float) -> float | None:
        if self.stalled is not None:  # the standby looks every retry_s; then the resume
            end = self.stalled[1] + self.spec.pause_s
            return min(t + self.electors["a"].settings.retry_s, end)
        return None  # the next stall waits for news, and news brings a pass

    def report(self) -> dict[str, Any]:
        return {
            "skew_s": self.spec.skew_s,
            "budget_limits": dict(sorted(self.limits.items())),
            "most_over_budget": max(0, self.worst_over),
            **dict(sorted(self.counts.items())),
        }
