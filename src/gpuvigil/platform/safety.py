"""Fleet safety around the policy: disruption budget per pool, action rate limit, the
circuit breaker, exclusions by label. No I/O, no clock (everything takes `now`).

The controller builds a `Gate` once per reconcile pass from the nodes it read, asks it for
each node's `policy.Fleet` before deciding, and tells it when a decision consumed budget.
Budget and rate are counted from the records stored on the nodes (level-based), so a
restarted controller counts what is in flight exactly as the one that died did.

The breaker trips when more than `breaker_unhealthy_percent` of the fleet turned unhealthy
within `breaker_window_s`, or when one check fails closed on `breaker_same_check_nodes`
nodes at once (a driver upgrade dropped a binary). Open, it stops new disruptions only:
blocking new work, steps already admitted, and recoveries all continue.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import Field

from gpuvigil.core.codes import COULD_NOT_RUN
from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import Status
from gpuvigil.platform.policy import Fleet
from gpuvigil.platform.state import NodeView, Record, State


class PoolLimit(StrictModel):
    max_disrupted: int | None = Field(None, ge=0)
    max_disrupted_percent: float | None = Field(None, ge=0, le=100)


class SafetyConfig(StrictModel):
    """Budgets and the breaker; every default is explained in docs/controller.md."""

    max_disrupted: int = Field(2, ge=0)  # nodes DRAINING/REMEDIATING per pool, at most
    max_disrupted_percent: float = Field(10.0, ge=0, le=100)  # of the pool, rounded up
    pool_label: str = "gpuvigil.io/pool"  # nodes without it are in pool "default"
    pools: dict[str, PoolLimit] = Field(default_factory=dict)  # per-pool overrides
    max_actions: int = Field(10, ge=0)  # new disruptions per rate window, fleet-wide
    rate_window_s: float = Field(300.0, gt=0)
    breaker_unhealthy_percent: float = Field(10.0, gt=0, le=100)
    breaker_same_check_nodes: int = Field(5, ge=1)  # one could-not-run check on this many
    breaker_min_nodes: int = Field(3, ge=1)  # never trip on fewer unhealthy nodes than this
    breaker_window_s: float = Field(600.0, gt=0)
    breaker_close_after_s: float = Field(900.0, ge=0)  # clear this long -> closes again
    exclude_labels: dict[str, str] = Field(
        default_factory=lambda: {"gpuvigil.io/exclude": "true"}
    )  # a node with any of these labels (value "*": any value) is observed, never acted on


def excluded(node: NodeView, config: SafetyConfig) -> bool:
    for key, want in config.exclude_labels.items():
        have = node.labels.get(key)
        if have is not None and want in ("*", have):
            return True
    return False


def pool_of(node: NodeView, config: SafetyConfig) -> str:
    return node.labels.get(config.pool_label) or node.pool or "default"


def pool_limit(pool: str, size: int, config: SafetyConfig) -> int:
    over = config.pools.get(pool, PoolLimit())
    absolute = over.max_disrupted if over.max_disrupted is not None else config.max_disrupted
    pct = (
        over.max_disrupted_percent
        if over.max_disrupted_percent is not None
        else config.max_disrupted_percent
    )
    # Round the share up (like maxUnavailable), so a small pool can still repair one node.
    return min(absolute, math.ceil(pct * size / 100))


def episode_start(record: Record | None) -> datetime | None:
    """When the node last left HEALTHY (None while it is HEALTHY)."""
    if record is None or record.state is State.HEALTHY:
        return None
    start = record.since
    for t in reversed(record.history):
        if t.to is State.HEALTHY:
            break
        start = t.at
    return start


@dataclass
class BreakerStatus:
    open: bool = False
    reason: str = ""
    opened_at: datetime | None = None
    clear_since: datetime | None = None
    trips: int = 0


@dataclass
class Breaker:
    """The circuit breaker's memory between passes (hysteresis); the trip test is level-based."""

    config: SafetyConfig
    status: BreakerStatus = field(default_factory=BreakerStatus)
    # When each node without a stored episode was first seen bad (a node a human cordoned
    # and gpuvigil leaves alone stays bad without "turning" again). Lost on restart, which
    # only makes a restarted controller more careful for one window.
    first_bad: dict[str, datetime] = field(default_factory=dict)

    def evaluate(self, nodes: list[NodeView], *, now: datetime) -> str:
        """Why the breaker should be open now, or "" when the fleet looks normal."""
        cfg, n = self.config, len(nodes)
        if not n:
            return ""
        turned = 0
        same: Counter[tuple[str, str]] = Counter()
        seen: set[str] = set()
        for v in nodes:
            start = episode_start(v.record)
            if start is None and v.health is not None and v.health.status is Status.FAILED:
                start = self.first_bad.setdefault(v.name, now)  # about to turn: count it now
                seen.add(v.name)
            if start is not None and (now - start).total_seconds() <= cfg.breaker_window_s:
                turned += 1
            if v.health is not None:
                same.update(
                    {(f.check, f.code) for f in v.health.findings if f.code in COULD_NOT_RUN}
                )
        for name in [n for n in self.first_bad if n not in seen]:
            del self.first_bad[name]
        share = 100.0 * turned / n
        if turned >= cfg.breaker_min_nodes and share > cfg.breaker_unhealthy_percent:
            return (
                f"{turned} of {n} nodes ({share:.0f}%) turned unhealthy within "
                f"{cfg.breaker_window_s:.0f} s (limit {cfg.breaker_unhealthy_percent:g}%)"
            )
        if same:
            (check, code), count = same.most_common(1)[0]
            if count >= cfg.breaker_same_check_nodes:
                return f"check {check or '?'} fails closed ({code}) on {count} nodes at once"
        return ""

    def update(self, nodes: list[NodeView], *, now: datetime) -> str | None:
        """Re-evaluate; returns "open" or "closed" when the breaker changed, else None."""
        why = self.evaluate(nodes, now=now)
        st = self.status
        if why:
            st.clear_since = None
            st.reason = why
            if not st.open:
                st.open, st.opened_at, st.trips = True, now, st.trips + 1
                return "open"
            return None
        if not st.open:
            return None
        if st.clear_since is None:
            st.clear_since = now
        if (now - st.clear_since).total_seconds() >= self.config.breaker_close_after_s:
            st.open, st.reason, st.clear_since = False, "", None
            return "closed"
        return None


class Gate:
    """One pass's safety accounting: budget per pool and rate tokens, from stored records."""

    def __init__(
        self,
        config: SafetyConfig,
        nodes: Iterable[NodeView],
        *,
        now: datetime,
        breaker: BreakerStatus | None = None,
    ) -> None:
        self.config = config
        self.breaker = breaker or BreakerStatus()
        self.size: Counter[str] = Counter()
        self.in_use: Counter[str] = Counter()
        recent = 0
        for v in nodes:
            pool = pool_of(v, config)
            self.size[pool] += 1
            rec = v.record
            if rec is not None and rec.in_budget:
                self.in_use[pool] += 1
            last = rec.last_action_at if rec is not None else None
            if last is not None and (now - last).total_seconds() < config.rate_window_s:
                recent += 1
        self.tokens = max(0, config.max_actions - recent)

    def limit(self, pool: str) -> int:
        return pool_limit(pool, self.size[pool], self.config)

    def fleet_for(self, node: NodeView) -> Fleet:
        pool = pool_of(node, self.config)
        if self.breaker.open:
            return Fleet(False, f"circuit breaker open: {self.breaker.reason}", True)
        if self.in_use[pool] >= self.limit(pool):
            return Fleet(
                False,
                f"disruption budget of pool {pool} in use ({self.in_use[pool]}/{self.limit(pool)})",
            )
        if self.tokens <= 0:
            return Fleet(
                False,
                f"rate limit ({self.config.max_actions} per {self.config.rate_window_s:.0f} s)",
            )
        return Fleet(True)

    def consume(self, node: NodeView) -> None:
        self.in_use[pool_of(node, self.config)] += 1
        self.tokens -= 1

    def release(self, node: NodeView) -> None:
        """A node left DRAINING/REMEDIATING during this pass: its budget is free again."""
        pool = pool_of(node, self.config)
        self.in_use[pool] = max(0, self.in_use[pool] - 1)
