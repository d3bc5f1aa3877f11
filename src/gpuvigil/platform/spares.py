"""Hot spares: validated, idle nodes kept per pool for the ranks a gang job loses
(`controller.spares:`; docs/controller.md "Hot spares", docs/training.md).

Pure, no I/O, no clock (takes `now`). The controller (`platform.controller`) asks `plan`
once per pass, after its decisions, and applies it through the adapter's `Sparing`
methods (`clusters.base`); the simulator's controller runs the same pass over its
`MemoryCluster`. A spare is something the cluster's scheduler keeps ordinary work off
(k8s: the `gpuvigil.io/spare:NoSchedule` taint, which only gang pods tolerate; Slurm: the
spare reservation), so a gang job whose node is taken away gets its replacement pod (or
its requeued allocation) placed at once, without waiting in the queue behind other work.

Level-based like the rest of the controller: which nodes are spares is on the nodes
(`NodeView.spare`), so a restarted controller counts the same spares. Each pass:

- a spare that took work (a gang job's lost rank landed on it) is no longer one: it is
  an ordinary node of that job ("used"), and the pool is short by one;
- a spare that is no longer fit (a fault, a block, a stale report, not HEALTHY) stops
  being one ("unfit"), so it is never counted as capacity the job can rely on;
- spares past the pool's count are given back to the queue ("surplus");
- a pool short of its count gets fit idle nodes (`fill`), at most `max_new_per_pass`
  fleet-wide per pass, none while the circuit breaker is open (the fleet's signals are in doubt:
  a node that looks fit may not be), and never a node that holds work or is not
  validated. Making a spare evicts nothing, so it takes no disruption-budget slot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import Field, NonNegativeInt

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import Status
from gpuvigil.core.states import State
from gpuvigil.platform.state import NodeView


class SpareConfig(StrictModel):
    """`controller.spares:`. Every default is explained in docs/controller.md."""

    # Spares to keep per pool (the value of the node's `safety.pool_label`); a pool not
    # listed keeps `default`. 0 (the default): no spares, nothing is written.
    pools: dict[str, NonNegativeInt] = Field(default_factory=dict)
    default: NonNegativeInt = 0
    # New spares per pass, fleet-wide: refilling after a rack-wide event takes a few
    # passes instead of withdrawing many nodes from the queue at once.
    max_new_per_pass: NonNegativeInt = 4
    # A node whose agent report is older than this is not fit (its health is unknown).
    report_stale_s: float = Field(300.0, gt=0)
    # A node found holding work when it was to become a spare is not asked again for this
    # long (Kubernetes counts a node's pods only by listing them: one call per try).
    busy_recheck_s: float = Field(600.0, ge=0)

    def wanted(self, pool: str) -> int:
        return self.pools.get(pool, self.default)

    @property
    def enabled(self) -> bool:
        return self.default > 0 or any(self.pools.values())


@dataclass(frozen=True)
class Plan:
    """What one pass does about spares. `spares`: fit, idle spares kept per pool (before
    any new one); `need`: new spares to make per pool (after the rate); `candidates`: the
    nodes to try for them, best first (`fill` tries them)."""

    unmake: tuple[tuple[str, str], ...] = ()  # (node, "used" | "unfit: ..." | "surplus")
    spares: dict[str, int] = field(default_factory=dict)
    wanted: dict[str, int] = field(default_factory=dict)
    need: dict[str, int] = field(default_factory=dict)
    candidates: dict[str, tuple[str, ...]] = field(default_factory=dict)
    held: str = ""  # why a short pool gets no (or too few) new spares this pass

    def short(self, pool: str) -> int:
        return max(0, self.wanted.get(pool, 0) - self.spares.get(pool, 0))


def unfit(node: NodeView, *, now: datetime, state: State | None, stale_s: float) -> str:
    """Why `node` may not be (or stay) a spare; "" when it may. `state` is this pass's
    decision for it (None: none was taken, e.g. an excluded node: never a spare)."""
    if state is None:
        return "not managed"
    if state is not State.HEALTHY:
        return f"state {state.value}"
    if node.unvalidated:
        return "not validated"
    if node.blocked_by_us or node.blocked_by_others:
        return "blocked"
    if node.health is None:
        return f"health report {node.health_error or 'absent'}"
    if node.health.status is not Status.OK:
        return f"health {node.health.status.value}"
    age = node.heartbeat_age_s(now)
    if age is None or age > stale_s:
        return "health report stale"
    return ""


def plan(
    nodes: Iterable[NodeView],
    *,
    config: SpareConfig,
    states: Mapping[str, State],
    pool_of: Mapping[str, str],
    now: datetime,
    breaker_open: bool = False,
) -> Plan:
    """The pass's spare changes. `states`: each managed node's decided state this pass;
    `pool_of`: each node's pool (`safety.pool_of`)."""
    views = sorted(nodes, key=lambda v: v.name)
    wanted: dict[str, int] = {}
    for v in views:
        wanted.setdefault(pool_of[v.name], config.wanted(pool_of[v.name]))
    kept: Counter[str] = Counter()
    unmake: list[tuple[str, str]] = []
    candidates: dict[str, list[NodeView]] = {}
    for v in views:
        pool = pool_of[v.name]
        why = unfit(v, now=now, state=states.get(v.name), stale_s=config.report_stale_s)
        if v.spare:
            if v.running:
                unmake.append((v.name, "used"))
            elif why:
                unmake.append((v.name, f"unfit: {why}"))
            elif kept[pool] >= wanted[pool]:
                unmake.append((v.name, "surplus"))
            else:
                kept[pool] += 1
        elif not why and not v.running and wanted[pool]:
            candidates.setdefault(pool, []).append(v)
    need: dict[str, int] = {}
    held = ""
    budget = config.max_new_per_pass
    for pool in sorted(wanted):
        short = wanted[pool] - kept[pool]
        if short <= 0:
            continue
        if breaker_open:
            held = "circuit breaker open"
            continue
        need[pool] = min(short, budget)
        budget -= need[pool]
        if need[pool] < short:
            held = held or "rate: max_new_per_pass"
    return Plan(
        unmake=tuple(unmake),
        spares={p: kept[p] for p in wanted},
        wanted=wanted,
        need={p: n for p, n in need.items() if n},
        # A machine with the fewest past episodes first (the least likely lemon), then
        # by name: a spare is the node a job's ranks land on when another one failed.
        candidates={
            p: tuple(v.name for v in sorted(candidates.get(p, []), key=_preference)) for p in need
        },
        held=held,
    )


def fill(
    plan: Plan, make: Callable[[str], bool], *, max_tries: int, skip: Container[str] = ()
) -> tuple[dict[str, int], list[str]]:
    """Make the plan's new spares: try each short pool's candidates in order (`make`: the
    adapter's `make_spare`, False when the node holds work), at most `max_tries` tries
    in all (an adapter may know a node's work only by asking). Returns the spares per
    pool after, and the nodes that refused (busy: the caller skips them for a while)."""
    kept = dict(plan.spares)
    refused: list[str] = []
    tries = 0
    for pool, n in plan.need.items():
        made = 0
        for name in plan.candidates.get(pool, ()):
            if made >= n or tries >= max_tries:
                break
            if name in skip:
                continue
            tries += 1
            if make(name):
                made += 1
            else:
                refused.append(name)
        kept[pool] = kept.get(pool, 0) + made
    return kept, refused


def _preference(v: NodeView) -> tuple[int, str]:
    return (len(v.record.episodes) if v.record else 0, v.name)
