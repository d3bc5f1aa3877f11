"""The capacity gate for serving pools: may a disruptive step (a node drain, a per-GPU
eviction, a GPU reset) go ahead without taking a serving pool below its demand? Pure: no
I/O, no clock (everything takes `now`).

- Demand `D` is the maximum over the pool's sources; a source that is missing, failed or
  older than `signal_stale_s` makes the signal missing (a maximum over fewer sources could
  be too low).
- Required `R = max(ceil(D * (1 + percent/100)), D + min_extra)`.
- Healthy `H`: Ready, not terminating replicas that are not on the faulty GPU (or on the
  faulty node, when the whole node is at fault). Replicas on broken hardware serve nothing
  to count on, and never block their own eviction.
- `L`: the healthy replicas the step removes.

`H - L >= R`, or `L == 0`: proceed (through the Eviction API, so PDBs still apply).
Otherwise make before break: scale up by what is missing, wait for Ready, proceed, restore.
No room (`maxReplicas`, too few spare GPUs, or the added replicas not Ready in time): hold,
and retry every pass. Suspected silent data corruption bypasses the gate. A missing signal
holds (or proceeds, `on_missing_signal: proceed`) and escalates after `escalate_after_s`.

Called by the controller's serving hook (`platform.serving_hook`) with what the Kubernetes
adapter read (`clusters.k8s_serving`), and by the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpuvigil.platform.serving_pool import ServingPool


class StepKind(StrEnum):
    DRAIN = "drain"  # every replica on the node goes
    EVICT_GPU = "evict-gpu"  # the holders of `removes` go
    RESET_GPU = "reset-gpu"  # the holders of `removes` stop serving while it resets
    REBOOT = "reboot"  # every replica on the node stops


class Verdict(StrEnum):
    PROCEED = "proceed"
    BYPASS = "bypass"  # suspected silent data corruption: proceed, audited
    SCALE_UP = "scale-up"  # make before break: raise replicas to `scale_to`
    WAIT = "wait"  # the added replicas are not Ready yet
    HOLD = "hold"  # no room, or no demand signal: HeldForCapacity, retry next pass

    @property
    def goes(self) -> bool:
        return self in (Verdict.PROCEED, Verdict.BYPASS)


class HoldReason(StrEnum):
    NONE = ""
    NO_ROOM = "NoRoom"  # maxReplicas, spare GPUs, or added replicas never Ready
    NO_SIGNAL = "DemandSignalMissing"  # missing or stale demand


@dataclass(frozen=True)
class Demand:
    """One source's reading: replicas, when it was true, or why there is none."""

    source: str
    replicas: int | None
    at: datetime | None
    error: str = ""


@dataclass(frozen=True)
class Replica:
    name: str
    node: str
    gpus: frozenset[str] | None = None  # the device ids it holds; None: not known
    ready: bool = True
    terminating: bool = False


@dataclass(frozen=True)
class Step:
    kind: StepKind
    node: str
    faulty: frozenset[str] | None = None  # faulty device ids; None: the whole node
    removes: frozenset[str] | None = None  # devices the step takes; None: the whole node
    bypass: str = ""  # the suspected-corruption finding code that skips the gate


@dataclass(frozen=True)
class ScaleMark:
    """A make-before-break in progress, kept on the workload (level-based): who asked,
    how many replicas it added, what to restore, since when."""

    node: str
    added: int
    original: int
    at: datetime
    original_min: int | None = None  # the HPA's minReplicas before we raised it
    # the HPA's desiredReplicas before we raised its floor: a real HPA's desiredReplicas
    # is clamped to minReplicas, so under our floor it reads the floor, not the demand
    hpa_desired: int | None = None


@dataclass(frozen=True)
class PoolState:
    replicas: tuple[Replica, ...]
    demand: tuple[Demand, ...]
    desired: int  # the workload's spec.replicas now
    max_replicas: int | None = None  # the HPA's maxReplicas; None: no HPA cap
    spare_gpus: int | None = None  # free GPUs where a new replica may go; None: not known
    mark: ScaleMark | None = None


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    pool: str
    healthy: int = 0  # H
    removed: int = 0  # L
    demand: int | None = None  # D
    required: int | None = None  # R
    scale_to: int | None = None  # SCALE_UP: the workload's new replicas
    added: int = 0  # SCALE_UP: replicas added
    hold: HoldReason = HoldReason.NONE
    escalate: bool = False  # held without a signal past escalate_after_s
    missing: tuple[str, ...] = ()  # sources missing or stale, with why
    reason: str = ""

    @property
    def goes(self) -> bool:
        return self.verdict.goes


def required(demand: int, pool: ServingPool) -> int:
    h = pool.headroom
    # the rounding guard: 10 * 1.1 is 11.000000000000002 in floats, which is 11, not 12
    scaled = math.ceil(round(demand * (1 + h.percent / 100), 9))
    return max(scaled, demand + h.min_extra)


def demand_of(
    readings: Iterable[Demand], pool: ServingPool, *, now: datetime
) -> tuple[int | None, tuple[str, ...]]:
    """D, and the sources that are missing or stale (then D is None)."""
    readings = list(readings)
    missing: list[str] = []
    seen = {r.source for r in readings}
    missing += [f"{s.label}: not read" for s in pool.demand if s.label not in seen]
    values: list[int] = []
    for r in readings:
        if r.error or r.replicas is None or r.at is None:
            missing.append(f"{r.source}: {r.error or 'no value'}")
        elif (now - r.at).total_seconds() > pool.signal_stale_s:
            age = (now - r.at).total_seconds()
            missing.append(f"{r.source}: stale ({age:.0f} s > {pool.signal_stale_s:.0f} s)")
        else:
            values.append(max(0, r.replicas))
    if missing or not values:
        return None, tuple(missing) or ("no demand source",)
    return max(values), ()


def _on_faulty(r: Replica, step: Step) -> bool:
    if r.node != step.node:
        return False
    if step.faulty is None:
        return True
    return r.gpus is not None and bool(r.gpus & step.faulty)


def _removed_by(r: Replica, step: Step) -> bool:
    if r.node != step.node:
        return False
    if step.removes is None:
        return True
    return r.gpus is None or bool(r.gpus & step.removes)  # unknown devices: assume it goes


def judge(
    pool: ServingPool,
    state: PoolState,
    step: Step,
    *,
    now: datetime,
    held_since: datetime | None = None,
) -> Judgement:
    """The gate's answer for one pool. `held_since`: when this node was first held for
    capacity (its HeldForCapacity condition), for the escalation timeout."""
    healthy = [
        r for r in state.replicas if r.ready and not r.terminating and not _on_faulty(r, step)
    ]
    h = len(healthy)
    lost = sum(1 for r in healthy if _removed_by(r, step))
    d: int | None = None
    r: int | None = None

    def out(verdict: Verdict, reason: str, **kw: object) -> Judgement:
        return Judgement(
            verdict,
            pool.name,
            healthy=h,
            removed=lost,
            demand=d,
            required=r,
            reason=reason,
            **kw,  # type: ignore[arg-type]
        )

    if step.bypass:
        why = f"suspected silent data corruption ({step.bypass}): the gate is bypassed"
        return out(Verdict.BYPASS, why)
    if lost == 0:
        why = "the step removes no healthy replica of the pool"
        return out(Verdict.PROCEED, why)
    d, missing = demand_of(state.demand, pool, now=now)
    if d is None:
        if pool.on_missing_signal == "proceed":
            why = f"demand signal missing ({'; '.join(missing)}); on_missing_signal: proceed"
            return out(Verdict.PROCEED, why, missing=missing)
        since = held_since or now
        late = (now - since).total_seconds() >= pool.escalate_after_s
        why = f"demand signal missing ({'; '.join(missing)}): held"
        if late:
            why += f" for {(now - since).total_seconds():.0f} s, escalated"
        return out(Verdict.HOLD, why, hold=HoldReason.NO_SIGNAL, escalate=late, missing=missing)
    r = required(d, pool)
    if h - lost >= r:
        why = f"H - L = {h} - {lost} >= R = {r}"
        return out(Verdict.PROCEED, why)
    need = r - (h - lost)
    mark = state.mark
    if mark is not None and mark.node == step.node:
        waited = (now - mark.at).total_seconds()
        if waited > pool.ready_timeout_s:
            why = (
                f"H - L = {h} - {lost} < R = {r}: the {mark.added} added replicas are not "
                f"Ready after {waited:.0f} s (ready_timeout_s {pool.ready_timeout_s:.0f})"
            )
            return out(Verdict.HOLD, why, hold=HoldReason.NO_ROOM)
        why = f"H - L = {h} - {lost} < R = {r}: waiting for {need} added replicas to be Ready"
        return out(Verdict.WAIT, why)
    if mark is not None:  # another node's make-before-break holds the workload's scale
        why = f"H - L = {h} - {lost} < R = {r}: the pool is scaled up for node {mark.node}"
        return out(Verdict.HOLD, why, hold=HoldReason.NO_ROOM)
    target = state.desired + need
    caps = [c for c in (state.max_replicas, pool.max_replicas) if c is not None]
    if pool.workload is None:
        room = "no workload to scale (set `workload`)"
    elif caps and target > min(caps):
        room = f"{target} replicas would pass maxReplicas {min(caps)}"
    elif state.spare_gpus is not None and need * pool.gpus_per_replica > state.spare_gpus:
        room = f"{need} replicas need {need * pool.gpus_per_replica} GPUs, {state.spare_gpus} spare"
    else:
        why = f"H - L = {h} - {lost} < R = {r}: make before break, {need} more replicas"
        return out(Verdict.SCALE_UP, why, scale_to=target, added=need)
    why = f"H - L = {h} - {lost} < R = {r} and no room: {room}"
    return out(Verdict.HOLD, why, hold=HoldReason.NO_ROOM)


def restore_due(pool: ServingPool, state: PoolState, *, now: datetime, step_active: bool) -> bool:
    """Put the workload's replicas back once the step that scaled it up is over and the
    pool keeps R without the added replicas; give up holding the extra capacity after
    `escalate_after_s` past the step's end, whatever the signal says."""
    mark = state.mark
    if mark is None or step_active:
        return False
    if (now - mark.at).total_seconds() > pool.ready_timeout_s + pool.escalate_after_s:
        return True
    d, _ = demand_of(state.demand, pool, now=now)
    if d is None:
        return False
    h = sum(1 for r in state.replicas if r.ready and not r.terminating)
    return h - mark.added >= required(d, pool)


def combine(judgements: Iterable[Judgement]) -> Judgement | None:
    """The step goes only when every pool lets it: the first that does not, else the first
    bypass, else the first proceed. None when there are no pools."""
    js = list(judgements)
    order = (Verdict.HOLD, Verdict.SCALE_UP, Verdict.WAIT, Verdict.BYPASS, Verdict.PROCEED)
    for v in order:
        for j in js:
            if j.verdict is v:
                return j
    return None
