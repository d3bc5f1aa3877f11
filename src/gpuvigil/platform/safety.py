"""Fleet safety around the policy: disruption budget per pool, action rate limit,
exclusions by label, and the settings of the circuit breaker (`platform.breaker`). No I/O,
no clock (everything takes `now`).

The controller builds a `Gate` once per reconcile pass from the nodes it read, asks it for
each node's `policy.Fleet` before deciding, and tells it when a decision consumed budget.
Budget and rate are counted from the records stored on the nodes (level-based), so a
restarted controller counts what is in flight exactly as the one that died did. What the
breaker holds on a node (findings of an open signature, staleness in a silent pool, a
probe) comes from `Breaker.hold_for` and travels in the same `Fleet`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import Status
from gpuvigil.platform.policy import Fleet
from gpuvigil.platform.state import (
    DEFAULT_POOL,
    POOL_LABEL,
    Episode,
    NodeView,
    State,
    pool_of_labels,
)

if TYPE_CHECKING:
    from gpuvigil.platform.breaker import Breaker
    from gpuvigil.platform.replacements import Replacements

# Node attributes the breaker groups new findings by, when a node has them: the driver
# version (GPU feature discovery labels, joined), the kernel and OS image (the Kubernetes
# adapter's nodeInfo; Slurm's kernel), the instance type and topology labels. The pool
# (`pool_label`) is always one.
DEFAULT_ATTRIBUTES = [
    "driver-version",
    "kernel-version",
    "os-image",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/zone",
    "gpuvigil.io/rack",
    "gpuvigil.io/switch",
    "features",
]
# Attributes that name where a machine is, not what was changed on it: a burst on one is
# a hardware event (a rack's power, a leaf switch), repaired as such and alerted on.
TOPOLOGY_ATTRIBUTES = ["topology.kubernetes.io/zone", "gpuvigil.io/rack", "gpuvigil.io/switch"]


class PoolLimit(StrictModel):
    max_disrupted: int | None = Field(None, ge=0)
    max_disrupted_percent: float | None = Field(None, ge=0, le=100)


class SafetyConfig(StrictModel):
    """Budgets and the breaker; every default is explained in docs/controller.md."""

    max_disrupted: int = Field(2, ge=0)  # nodes DRAINING/REMEDIATING per pool, at most
    max_disrupted_percent: float = Field(10.0, ge=0, le=100)  # of the pool, rounded up
    pool_label: str = POOL_LABEL  # nodes without it are in pool "default"
    pools: dict[str, PoolLimit] = Field(default_factory=dict)  # per-pool overrides
    max_actions: int = Field(10, ge=0)  # new disruptions per rate window, fleet-wide
    rate_window_s: float = Field(300.0, gt=0)
    # Quarantines, the costliest action (a person must look), fleet-wide per window: past
    # it a node due one stays blocked (SUSPECT) until a slot frees.
    max_quarantines: int = Field(5, ge=0)
    quarantine_window_s: float = Field(3600.0, gt=0)
    # The circuit breaker (platform.breaker, platform.signatures; docs/controller.md).
    breaker_attributes: list[str] = Field(default_factory=lambda: list(DEFAULT_ATTRIBUTES))
    breaker_background_per_node_day: float = Field(0.02, gt=0)  # one finding, one node
    breaker_p_value: float = Field(1e-6, gt=0, lt=1)  # rarer than this by chance: a cause
    breaker_min_nodes: int = Field(3, ge=1)  # never trip on fewer nodes than this
    # ... except a suspected change (not the pool, the fleet or topology) that every node
    # carrying it shows: a rollout's first batch of 2, both failing, trips from this many
    breaker_min_change_nodes: int = Field(2, ge=1)
    breaker_window_s: float = Field(600.0, gt=0)  # findings this recent are "new"
    # The level: nodes showing a finding now that began within this window (a rollout in
    # small batches never puts breaker_min_nodes in one breaker_window_s).
    breaker_level_window_s: float = Field(21600.0, gt=0)
    # What may name a cause: a value the controller saw appear within this window, or
    # one fewer than this share of its pool's nodes carry; never a long-shared baseline.
    breaker_change_window_s: float = Field(604800.0, ge=0)
    breaker_minority_percent: float = Field(50.0, ge=0, le=100)
    breaker_min_pool_nodes: int = Field(8, ge=1)  # smaller pools never trip on the pool
    breaker_topology_attributes: list[str] = Field(
        default_factory=lambda: list(TOPOLOGY_ATTRIBUTES)
    )  # a burst on one of these is a hardware event: blocked, repaired, alerted on
    breaker_hold_blocks: bool = True  # held findings do not block (false: block, never act)
    breaker_close_after_s: float = Field(900.0, ge=0)  # a cause gone this long closes
    breaker_probe_after_s: float = Field(28800.0, gt=0)  # then one held node is repaired
    breaker_probe_interval_s: float = Field(3600.0, gt=0)  # after a probe that did not cure
    breaker_stale_percent: float = Field(10.0, gt=0, le=100)  # of a pool silent at once
    breaker_stale_min_nodes: int = Field(3, ge=1)
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
    # A view the adapter built has the pool already; one built from labels alone (the
    # simulator's, a test's) has only the label.
    return pool_of_labels(node.labels, label=config.pool_label, default=node.pool or DEFAULT_POOL)


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


def _idle_fit(node: NodeView, *, now: datetime, stale_s: float) -> bool:
    """Whether `node` could take moved work now: no work of its own, in service (HEALTHY
    or never in an episode), unblocked, validated, and a fresh clean report."""
    rec = node.record
    if not node.running_known or node.running > 0:
        return False
    if rec is not None and rec.state is not State.HEALTHY:
        return False
    if node.unvalidated or node.blocked_by_us or node.blocked_by_others:
        return False
    if node.health is None or node.health.status is not Status.OK:
        return False
    age = node.heartbeat_age_s(now)
    return age is not None and age <= stale_s


class Gate:
    """One pass's safety accounting: budget per pool and rate tokens, from stored records
    and the budget ledger's slots (`reserved`: node -> pool, `platform.budget`; a node counts
    once whether its record, its slot or both hold the budget); and, per node, what the
    breaker holds and what a replacement ledger says."""

    def __init__(
        self,
        config: SafetyConfig,
        nodes: Sequence[NodeView],
        *,
        now: datetime,
        breaker: Breaker | None = None,
        replacements: Replacements | None = None,
        reserved: Mapping[str, str] | None = None,
        machines: Mapping[str, tuple[Episode, ...]] | None = None,
        room_stale_s: float = 300.0,
    ) -> None:
        from gpuvigil.platform.signatures import census

        self.config = config
        self.breaker = breaker
        self.replacements = replacements
        self.machines = machines or {}  # provider id -> its episodes (controller memory)
        self.in_use: Counter[str] = Counter()
        slots = dict(reserved or {})
        own = getattr(nodes, "census", None)  # a list that knows the whole fleet (simulator)
        self.size: Counter[str] = Counter()
        if own is not None:
            sizes = census(nodes, config)
            self.size.update({p: n for (a, p), n in sizes.items() if a == config.pool_label})
        recent = quarantines = 0
        for v in nodes:
            pool = pool_of(v, config)
            if own is None:
                self.size[pool] += 1
            rec = v.record
            if rec is not None and rec.in_budget:
                self.in_use[pool] += 1
                slots.pop(v.name, None)
            last = rec.last_action_at if rec is not None else None
            if last is not None and (now - last).total_seconds() < config.rate_window_s:
                recent += 1
            if (
                rec is not None
                and rec.state is State.QUARANTINED
                and rec.since is not None
                and (now - rec.since).total_seconds() < config.quarantine_window_s
            ):
                quarantines += 1
        for pool in slots.values():  # slots whose record does not show it (yet)
            self.in_use[pool] += 1
        # Idle, fit nodes per pool: room for the work a drain moves. A simulator's list
        # of the nodes in an episode carries the idle ones it does not list (`idle`).
        self.room: Counter[str] = Counter(getattr(nodes, "idle", None) or {})
        for v in nodes:
            if _idle_fit(v, now=now, stale_s=room_stale_s):
                self.room[pool_of(v, config)] += 1
        self.tokens = max(0, config.max_actions - recent)
        self.quarantine_tokens = max(0, config.max_quarantines - quarantines)
        # once per pass: every node of a pool asks for the same limit
        self._limits = {p: pool_limit(p, n, config) for p, n in self.size.items()}

    def limit(self, pool: str) -> int:
        if pool not in self._limits:
            self._limits[pool] = pool_limit(pool, self.size[pool], self.config)
        return self._limits[pool]

    def fleet_for(self, node: NodeView) -> Fleet:
        from gpuvigil.platform.breaker import PROBE_MAX_STEP, Hold

        pool = pool_of(node, self.config)
        why = ""
        if self.in_use[pool] >= self.limit(pool):
            used = f"{self.in_use[pool]}/{self.limit(pool)}"
            why = f"disruption budget of pool {pool} in use ({used})"
        elif self.tokens <= 0:
            why = f"rate limit ({self.config.max_actions} per {self.config.rate_window_s:.0f} s)"
        hold = self.breaker.hold_for(node) if self.breaker is not None else Hold()
        machine = self.replacements.verdict(node) if self.replacements is not None else None
        rec = node.record
        history: tuple[Episode, ...] = ()
        if node.provider_id and (rec is None or not rec.episodes):  # renamed: its past
            history = self.machines.get(node.provider_id, ())
        return Fleet(
            history=history,
            may_disrupt=not why,
            why_not=why,
            held=hold.keys,
            held_reason=hold.reason,
            hold_mark=hold.mark,
            hold_blocks=self.config.breaker_hold_blocks,
            stale=hold.stale,
            max_step=PROBE_MAX_STEP if hold.probe else None,
            returned=machine.returned if machine else "",
            replaces=machine.replaces if machine else "",
            breaker_open=self.breaker is not None and self.breaker.status.open,
            room=self.room[pool] > 0,
            may_quarantine=self.quarantine_tokens > 0,
            quarantine_why="" if self.quarantine_tokens > 0 else (
                f"quarantine rate limit ({self.config.max_quarantines} per "
                f"{self.config.quarantine_window_s:.0f} s)"),
        )  # fmt: skip

    def consume(self, node: NodeView) -> None:
        """A disruption starts on `node`: a budget slot, a rate token, and (where its work
        goes) one idle node of its pool."""
        pool = pool_of(node, self.config)
        self.in_use[pool] += 1
        self.tokens -= 1
        if node.running > 0 and self.room[pool] > 0:
            self.room[pool] -= 1

    def quarantined(self) -> None:
        """A node entered QUARANTINED during this pass: one quarantine slot fewer."""
        self.quarantine_tokens -= 1

    def release(self, node: NodeView) -> None:
        """A node left DRAINING/REMEDIATING during this pass: its budget is free again."""
        pool = pool_of(node, self.config)
        self.in_use[pool] = max(0, self.in_use[pool] - 1)
