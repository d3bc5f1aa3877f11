"""Fleet safety around the policy: disruption budget per pool, action rate limit, the
circuit breaker, exclusions by label. No I/O, no clock (everything takes `now`).

The controller builds a `Gate` once per reconcile pass from the nodes it read, asks it for
each node's `policy.Fleet` before deciding, and tells it when a decision consumed budget.
Budget and rate are counted from the records stored on the nodes (level-based), so a
restarted controller counts what is in flight exactly as the one that died did.

The breaker trips when more than `breaker_unhealthy_percent` of the fleet turned unhealthy
within `breaker_window_s` (the share cause: it stops new disruptions; blocking new work,
steps already admitted and recoveries continue), or when one check fails closed on
`breaker_same_check_nodes` nodes at once (a driver upgrade dropped a binary: the tool
cause; with `breaker_hold_blocks_for_tool_breakage` the policy does not block a node for
that check's could-not-run findings alone, and lifts such blocks it set). Each cause stays
while its lower threshold holds; the breaker closes `breaker_close_after_s` after the last.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
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
    breaker_close_percent: float = Field(5.0, ge=0, le=100)  # open share cause: stays above
    breaker_same_check_nodes: int = Field(5, ge=1)  # one could-not-run check on this many
    breaker_same_check_close_nodes: int = Field(3, ge=1)  # ... stays held while on this many
    breaker_hold_blocks_for_tool_breakage: bool = True  # see Breaker and docs/controller.md
    breaker_min_nodes: int = Field(3, ge=1)  # never trip on fewer unhealthy nodes than this
    breaker_window_s: float = Field(600.0, gt=0)
    breaker_close_after_s: float = Field(900.0, ge=0)  # no cause holds this long -> closes
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
    # Why it is open: `share` (too many nodes unhealthy: holds new disruptions) and/or the
    # checks failing closed on many nodes at once (tool breakage: explains those findings).
    share: bool = False
    checks: frozenset[str] = frozenset()

    @property
    def holds_disruptions(self) -> bool:
        return self.open and self.share

    @property
    def causes(self) -> list[str]:
        return (["share"] if self.share else []) + [f"check:{c}" for c in sorted(self.checks)]


@dataclass(frozen=True)
class Trip:
    """One evaluation: which causes hold now (empty: the fleet looks normal)."""

    share: str = ""  # why the share cause holds, or ""
    checks: dict[str, str] = field(default_factory=dict)  # check -> why it is held

    def __bool__(self) -> bool:
        return bool(self.share or self.checks)

    @property
    def reason(self) -> str:
        parts = [self.share] if self.share else []
        return "; ".join([*parts, *self.checks.values()])


def _could_not_run(v: NodeView) -> dict[str, str]:
    """check -> code for every check that fails closed on this node."""
    if v.health is None:
        return {}
    return {f.check or "?": f.code for f in v.health.findings if f.code in COULD_NOT_RUN}


def _explained(v: NodeView, checks: frozenset[str]) -> bool:
    """Every FAILED finding on the node is a could-not-run finding of a held check."""
    if v.health is None or not checks:
        return False
    bad = [f for f in v.health.findings if f.status is Status.FAILED]
    return bool(bad) and all(f.code in COULD_NOT_RUN and f.check in checks for f in bad)


def _densest(starts: list[datetime], window_s: float) -> int:
    """The most of these (sorted) moments that fit in one window of `window_s`."""
    best, lo = 0, 0
    for hi, t in enumerate(starts):
        while (t - starts[lo]).total_seconds() > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


@dataclass
class Breaker:
    """The circuit breaker's memory between passes (hysteresis).

    Two causes, each judged from the level the nodes show now:
    - share: more than `breaker_unhealthy_percent` of the fleet turned unhealthy within
      `breaker_window_s` of each other and still is; it stays while at least
      `breaker_close_percent` (and `breaker_min_nodes`) is unhealthy now.
      It holds new disruptions (a bad driver looks like hardware on every node it hits).
    - check: one check fails closed on `breaker_same_check_nodes` nodes at once; it stays
      while it still does on `breaker_same_check_close_nodes`. That is evidence about the
      tool, not the GPUs: with `breaker_hold_blocks_for_tool_breakage` the policy does not
      block for those findings alone (`Gate` passes the checks in `Fleet.tolerated_checks`).
    The breaker closes once no cause has held for `breaker_close_after_s`.
    """

    config: SafetyConfig
    status: BreakerStatus = field(default_factory=BreakerStatus)
    # When each node without a stored episode was first seen bad (a node a human cordoned
    # and gpuvigil leaves alone stays bad without "turning" again). Lost on restart, which
    # only makes a restarted controller more careful for one window.
    first_bad: dict[str, datetime] = field(default_factory=dict)
    closed_reason: str = ""  # why it last closed, and the causes it had held (for events)
    closed_causes: list[str] = field(default_factory=list)

    def evaluate(self, nodes: list[NodeView], *, now: datetime) -> Trip:
        """Which causes hold now, given what is already open (the lower thresholds)."""
        cfg, n, st = self.config, len(nodes), self.status
        if not n:
            return Trip()
        per_check: Counter[str] = Counter()
        codes: dict[str, Counter[str]] = {}
        for v in nodes:
            for check, code in _could_not_run(v).items():
                per_check[check] += 1
                codes.setdefault(check, Counter())[code] += 1
        close_at = min(cfg.breaker_same_check_close_nodes, cfg.breaker_same_check_nodes)
        checks: dict[str, str] = {}
        for check, count in sorted(per_check.items()):
            held = st.open and check in st.checks
            if count >= cfg.breaker_same_check_nodes or (held and count >= close_at):
                code = codes[check].most_common(1)[0][0]
                checks[check] = f"check {check} fails closed ({code}) on {count} nodes at once"
        explained = frozenset(checks)
        starts: list[datetime] = []
        seen: set[str] = set()
        for v in nodes:
            bad_now = v.health is not None and v.health.status is Status.FAILED
            if not bad_now or _explained(v, explained):  # the tool's cause, not the fleet's
                continue
            start = episode_start(v.record)
            if (v.record is not None and v.record.state is State.QUARANTINED) or (
                start is None and v.blocked_by_others
            ):
                continue  # a person owns it: not part of a fleet event gpuvigil must judge
            if start is None:
                start = self.first_bad.setdefault(v.name, now)  # about to turn: count it now
                seen.add(v.name)
            starts.append(start)
        for name in [k for k in self.first_bad if k not in seen]:
            del self.first_bad[name]
        # Level-based, so a restarted controller judges as the one that died: the most
        # nodes still unhealthy whose episodes began within one window of each other.
        turned = _densest(sorted(starts), cfg.breaker_window_s)
        unhealthy = len(starts)
        share, now_share = 100.0 * turned / n, 100.0 * unhealthy / n
        why = ""
        if turned >= cfg.breaker_min_nodes and share > cfg.breaker_unhealthy_percent:
            why = (
                f"{turned} of {n} nodes ({share:.0f}%) turned unhealthy within "
                f"{cfg.breaker_window_s:.0f} s and still are (limit "
                f"{cfg.breaker_unhealthy_percent:g}%)"
            )
        elif (
            st.open
            and st.share
            and unhealthy >= cfg.breaker_min_nodes
            and now_share >= cfg.breaker_close_percent
        ):
            why = (
                f"{unhealthy} of {n} nodes ({now_share:.0f}%) still unhealthy "
                f"(closes below {cfg.breaker_close_percent:g}%)"
            )
        return Trip(why, checks)

    def update(self, nodes: list[NodeView], *, now: datetime) -> str | None:
        """Re-evaluate; returns "open" or "closed" when the breaker changed, else None."""
        trip = self.evaluate(nodes, now=now)
        st = self.status
        if trip:
            st.clear_since = None
            st.reason = trip.reason
            # each cause has its own lower threshold (evaluate); once none holds, the last
            # causes stay in force for `breaker_close_after_s` (hysteresis)
            st.share, st.checks = bool(trip.share), frozenset(trip.checks)
            if not st.open:
                st.open, st.opened_at, st.trips = True, now, st.trips + 1
                return "open"
            return None
        if not st.open:
            return None
        if st.clear_since is None:
            st.clear_since = now
        if (now - st.clear_since).total_seconds() >= self.config.breaker_close_after_s:
            cfg = self.config
            self.closed_causes = st.causes
            self.closed_reason = (
                f"below the close thresholds ({cfg.breaker_close_percent:g}% unhealthy, "
                f"{cfg.breaker_same_check_close_nodes} nodes per check) for "
                f"{cfg.breaker_close_after_s:.0f} s; had held: {st.reason}"
            )
            st.open, st.reason, st.clear_since = False, "", None
            st.share, st.checks = False, frozenset()
            return "closed"
        return None


class Gate:
    """One pass's safety accounting: budget per pool and rate tokens, from stored records
    and the budget ledger's slots (`reserved`: node -> pool, `platform.budget`); a node
    counts once whether its record, its slot or both hold the budget."""

    def __init__(
        self,
        config: SafetyConfig,
        nodes: Iterable[NodeView],
        *,
        now: datetime,
        breaker: BreakerStatus | None = None,
        reserved: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self.breaker = breaker or BreakerStatus()
        self.size: Counter[str] = Counter()
        self.in_use: Counter[str] = Counter()
        slots = dict(reserved or {})
        recent = 0
        for v in nodes:
            pool = pool_of(v, config)
            self.size[pool] += 1
            rec = v.record
            if rec is not None and rec.in_budget:
                self.in_use[pool] += 1
                slots.pop(v.name, None)
            last = rec.last_action_at if rec is not None else None
            if last is not None and (now - last).total_seconds() < config.rate_window_s:
                recent += 1
        for pool in slots.values():  # slots whose record does not show it (yet)
            self.in_use[pool] += 1
        self.tokens = max(0, config.max_actions - recent)
        # once per pass: every node of a pool asks for the same limit
        self._limits = {p: pool_limit(p, n, config) for p, n in self.size.items()}

    def limit(self, pool: str) -> int:
        if pool not in self._limits:
            self._limits[pool] = pool_limit(pool, self.size[pool], self.config)
        return self._limits[pool]

    def fleet_for(self, node: NodeView) -> Fleet:
        pool, br = pool_of(node, self.config), self.breaker
        hold = br.open and self.config.breaker_hold_blocks_for_tool_breakage
        tolerated = br.checks if hold else frozenset()
        why = ""
        if br.holds_disruptions:
            why = f"circuit breaker open: {br.reason}"
        elif self.in_use[pool] >= self.limit(pool):
            used = f"{self.in_use[pool]}/{self.limit(pool)}"
            why = f"disruption budget of pool {pool} in use ({used})"
        elif self.tokens <= 0:
            why = f"rate limit ({self.config.max_actions} per {self.config.rate_window_s:.0f} s)"
        return Fleet(not why, why, br.open, br.holds_disruptions, tolerated_checks=tolerated)

    def consume(self, node: NodeView) -> None:
        self.in_use[pool_of(node, self.config)] += 1
        self.tokens -= 1

    def release(self, node: NodeView) -> None:
        """A node left DRAINING/REMEDIATING during this pass: its budget is free again."""
        pool = pool_of(node, self.config)
        self.in_use[pool] = max(0, self.in_use[pool] - 1)
