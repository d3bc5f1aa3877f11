"""The circuit breaker's stale cause: silence is an infrastructure fault, not N hardware
faults. Pure (takes `now`).

Reports stale or unreadable on `breaker_stale_percent` of a pool (and at least
`breaker_stale_min_nodes`) at once is the monitoring failing (an API server outage, an
agent rollout, a partition), not the machines. While a pool's cause is open the policy
neither blocks its stale nodes nor escalates or quarantines anything for lack of news
(`Fleet.stale`); it closes once fewer than half the trip count are stale for
`breaker_close_after_s`. One stale node alone still fails closed (blocked, never drained).
Called by `platform.breaker.Breaker.update` each pass.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpuvigil.core import freshness
from gpuvigil.platform.safety import SafetyConfig, pool_of
from gpuvigil.platform.state import NodeView


@dataclass(frozen=True)
class Change:
    """A breaker cause opened or closed (the controller turns each into an event and a log
    line)."""

    state: str  # "open" | "closed"
    cause: str  # a signature's id, or "stale:<pool>"
    reason: str
    detail: dict[str, object] = field(default_factory=dict)


@dataclass
class StaleCause:
    pool: str
    opened_at: datetime
    stale: int
    size: int
    threshold: int
    clear_since: datetime | None = None

    @property
    def reason(self) -> str:
        return (
            f"reports stale or missing on {self.stale} of {self.size} nodes of pool "
            f"{self.pool} at once: the monitoring is failing, not the machines"
        )


def silent(v: NodeView, *, now: datetime, stale_s: float) -> bool:
    """Reports stale or unreadable on a node that had reported (one never deployed is not
    silent: it never spoke)."""
    if v.health is None:
        return v.health_error == "unreadable"
    return not freshness.judge(v.heartbeat_at, now=now, max_age_s=stale_s).fresh


def judge_stale(
    causes: dict[str, StaleCause],
    nodes: Sequence[NodeView],
    sizes: Counter[tuple[str, str]],
    *,
    now: datetime,
    config: SafetyConfig,
    heartbeat_stale_s: float,
) -> list[Change]:
    """Open, keep or close each pool's stale cause in `causes` (updated in place)."""
    changes: list[Change] = []
    stale: Counter[str] = Counter()
    for v in nodes:
        if silent(v, now=now, stale_s=heartbeat_stale_s):
            stale[pool_of(v, config)] += 1
    for pool in sorted(set(stale) | set(causes)):
        size = sizes.get((config.pool_label, pool), 0) or stale[pool]
        trip = max(config.breaker_stale_min_nodes,
                   math.ceil(config.breaker_stale_percent * size / 100))  # fmt: skip
        cause = causes.get(pool)
        if cause is None:
            if stale[pool] >= trip:
                cause = causes[pool] = StaleCause(pool, now, stale[pool], size, trip)
                detail = {"pool": pool, "stale": stale[pool], "nodes": size}
                changes.append(Change("open", f"stale:{pool}", cause.reason, detail))
            continue
        cause.stale, cause.size = stale[pool], size
        if stale[pool] >= max(1, math.ceil(cause.threshold / 2)):
            cause.clear_since = None
            continue
        cause.clear_since = cause.clear_since or now
        if (now - cause.clear_since).total_seconds() >= config.breaker_close_after_s:
            del causes[pool]
            changes.append(Change("closed", f"stale:{pool}", f"reports back on pool {pool}"))
    return changes
