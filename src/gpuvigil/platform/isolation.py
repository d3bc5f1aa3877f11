"""Per-GPU isolation: one bad GPU costs one GPU, not the machine. Pure: no I/O, no clock.

    scope(findings, local=...) -> GpuFault | None      which GPU alone, if any
    decide_gpu(record, ..., now=...) -> GpuDecision    the GPU's own ladder, one pass

Called by the controller (`platform.controller`, before the node's own policy) and by the
simulator. The record of an isolated GPU (`Isolation`) lives on the node, owned by the
controller (Kubernetes: the annotation `ISOLATION_ANNOTATION`, docs/controller.md
"Per-GPU isolation"), so a restarted controller resumes from it, as with `state.Record`.

Which faults are one GPU's is data (`gpu_local_codes`): the Xids the catalog marks
`device_local` (xid.yaml) and the GPU error-counter codes of `error_counters.yaml`
`gpu_local`. Everything else is the whole node's (NVLink, NVSwitch, PCIe, the driver, a
check that could not run), as is a fault on two or more GPUs, and an isolation the cluster
does not enforce or that cannot be verified: then `decide_gpu` hands the node back to the
node ladder (`GpuDecision.per_gpu` False, `escalated` when a live isolation ends so).

The GPU's ladder: evict the GPU's holders (only them), reset that GPU (unless the fault
calls for a new GPU: a reset cannot cure it), and when the fault persists after the reset,
keep the GPU isolated until it is replaced (its index shows another uuid) or its findings
clear. The machine's memory (`state.Record.episodes`) gets an `Episode` with the GPU's
uuid when a reset cures it and when it is isolated for good (`remember`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuvigil.core.blocking import blocking_statuses
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import DOMAIN, FindingSummary, HealthSummary
from gpuvigil.platform.state import EPISODE_LIMIT, AgentResult, Episode, Record

ISOLATION_ANNOTATION = f"{DOMAIN}/gpu-isolation"  # the controller's `Isolation`, as JSON

# How the cluster keeps work off the GPU: the device plugin's allocatable, a DRA
# DeviceTaintRule, Slurm's degraded node (gres.conf without the GPU), the memory cluster.
Scope = Literal["device-plugin", "dra", "slurm", "memory"]
# The GPU's ladder: evict its holders, reset it, or hold it out until replaced.
Step = Literal["evicting", "resetting", "isolated"]


@lru_cache(maxsize=8)
def gpu_local_codes(family: str | None = None) -> frozenset[str]:
    """The finding codes confined to the GPU they name, from the shipped catalogs (the
    Xid catalog's `device_local` entries for `family`, and `error_counters.yaml`)."""
    from gpuvigil.core import codes
    from gpuvigil.node.catalog import error_counters, xid

    xids = xid.load_catalog().device_local(family)
    return frozenset(error_counters.load().gpu_local) | {codes.xid(n) for n in xids}


def gpu_index(component: str) -> int | None:
    """`gpu:3` -> 3; anything else (the node, a NIC, a PCI address, an NVSwitch) -> None."""
    kind, _, idx = component.partition(":")
    return int(idx) if kind == "gpu" and idx.isdigit() and len(idx) <= 4 else None


def uuids_of(findings: Iterable[FindingSummary]) -> dict[int, str]:
    """index -> uuid of the GPUs the findings name with a uuid (`FindingSummary.uuid`)."""
    out: dict[int, str] = {}
    for f in findings:
        index = gpu_index(f.component)
        if index is not None and f.uuid:
            out.setdefault(index, f.uuid)
    return out


@dataclass(frozen=True)
class GpuFault:
    """A fault confined to one GPU: its index, the worst code on it, and the action that
    code calls for (REPLACE: a reset cannot cure it)."""

    index: int
    code: str
    action: Action
    fatal: bool = False


def problems_of(
    findings: Iterable[FindingSummary], *, block_on_warning: bool = False
) -> list[FindingSummary]:
    """The findings that take work off a node (`core.blocking`, the one table)."""
    bad = blocking_statuses(block_on_warning=block_on_warning)
    return [f for f in findings if f.status in bad]


def why_whole_node(problems: Sequence[FindingSummary], *, local: frozenset[str]) -> str:
    """Why these problems are the whole node's ("" when they are one GPU's)."""
    if not problems:
        return "no problem"
    for f in problems:
        if gpu_index(f.component) is None:
            return f"{f.code} on {f.component} is not one GPU's"
        if f.code not in local:
            return f"{f.code} on {f.component} is not GPU-local (catalog)"
        if f.action is Action.INVESTIGATE:
            return f"{f.code} on {f.component} needs a human"
    gpus = sorted({i for f in problems if (i := gpu_index(f.component)) is not None})
    if len(gpus) > 1:
        return f"{len(gpus)} bad GPUs ({', '.join(f'gpu:{g}' for g in gpus)})"
    if Action.worst(f.action for f in problems).rank < Action.RESET_GPU.rank:
        return "no GPU step called for (the node's policy only blocks)"
    return ""


def scope(problems: Sequence[FindingSummary], *, local: frozenset[str]) -> GpuFault | None:
    """The one GPU these problems (`problems_of`) are confined to; None: the whole node
    (`why_whole_node` says why), or nothing wrong."""
    if why_whole_node(problems, local=local):
        return None
    worst = max(problems, key=lambda f: (f.action.rank, f.fatal, f.status.rank, f.code))
    index = gpu_index(worst.component)
    assert index is not None  # why_whole_node checked every component
    return GpuFault(index, worst.code, worst.action, any(f.fatal for f in problems))


class Isolation(BaseModel):
    """The one record of an isolated GPU, stored on its node (never in the controller)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int = 1
    node: str
    gpu_uuid: str = Field(min_length=1, max_length=128)
    index: int = Field(ge=0, le=1023)
    reason: str = ""  # for people: why the GPU is out
    since: datetime  # when the GPU was taken out of service
    scope: Scope = "device-plugin"
    # DRA: the device's `<driver>/<pool>/<device>`, what its DeviceTaintRule selects (kept so
    # the rule can be deleted even when no ResourceSlice publishes the device any more)
    device: str = Field("", max_length=600)
    code: str = ""  # the finding code that took it out
    step: Step = "evicting"
    step_since: datetime | None = None  # when `step` began (the reset's timeout)
    request_id: str = ""  # the RESET_GPU request for this GPU (the agent acts once per id)
    issued: str = ""  # the request id the controller confirmed it sent

    def encode(self) -> str:
        return self.model_dump_json(exclude_defaults=True)


def decode_isolation(text: str | None) -> Isolation | None:
    """The stored record; None for absent or garbage (never raises)."""
    if not text or len(text) > 4096:
        return None
    try:
        return Isolation.model_validate(json.loads(text))
    except (ValueError, ValidationError, TypeError, RecursionError):
        return None


class GpuConfig(BaseModel):
    """Timings of the GPU's ladder (seconds); defaults as the node ladder's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Before the holders are evicted (new work is already kept off the GPU), as the node
    # ladder waits before a drain: a fatal fault after `fatal_grace_s`, else after
    # `suspect_grace_s` (the controller passes its policy's values).
    fatal_grace_s: float = Field(120.0, ge=0)
    suspect_grace_s: float = Field(600.0, ge=0)
    evict_timeout_s: float = Field(900.0, ge=0)  # then holders are removed (as a drain)
    reset_timeout_s: float = Field(600.0, gt=0)  # no agent answer: the reset failed


OpKind = Literal["evict", "reset"]


@dataclass(frozen=True)
class GpuOp:
    """`evict`: move `holders` off the GPU through the Eviction API until `deadline`, then
    remove them (as a node drain does). `reset`: ask the agent for RESET_GPU of `index`."""

    kind: OpKind
    index: int
    holders: tuple[str, ...] = ()
    deadline: datetime | None = None
    request_id: str = ""


@dataclass(frozen=True)
class GpuDecision:
    """One pass of the GPU's ladder. `record`: what to store (None: delete the stored
    one, or store nothing); `per_gpu`: the GPU path handles the node's problems (hide
    the GPU's findings from the node's policy: `without_gpu`); `escalated`: a live
    isolation ended because the whole node's ladder must run; `episode`: append to the
    machine's memory (`remember`)."""

    record: Isolation | None
    per_gpu: bool
    reason: str
    ops: tuple[GpuOp, ...] = ()
    store: bool = False  # `record` changed (or was deleted) and must be written first
    escalated: bool = False
    episode: Episode | None = None


def _request_id(node: str, index: int, now: datetime) -> str:
    return f"{node}.reset_gpu{index}.{int(now.timestamp())}"


def _episode(rec: Isolation, *, now: datetime, outcome: str, reset: bool) -> Episode:
    steps = (Action.RESET_GPU,) if reset else ()
    codes = (rec.code,) if rec.code else ()
    return Episode(start=rec.since, end=now, codes=codes, steps=steps, outcome=outcome,
                   gpu=rec.gpu_uuid)  # fmt: skip


def remember(record: Record | None, episode: Episode) -> Record:
    """The node's record with `episode` appended to its machine's memory (bounded)."""
    rec = record or Record()
    return rec.model_copy(update={"episodes": (*rec.episodes, episode)[-EPISODE_LIMIT:]})


def handled(record: Isolation, finding: FindingSummary) -> bool:
    """A finding the GPU's ladder handles while `record` stands: a GPU-local fault of the
    isolated GPU. The node's policy judges the node without these (`policy.values.assess`)."""
    return gpu_index(finding.component) == record.index and finding.code in gpu_local_codes()


def without_gpu(health: HealthSummary, index: int, *, local: frozenset[str]) -> HealthSummary:
    """The summary the node's policy judges while GPU `index` is isolated: the GPU's own
    GPU-local findings are handled by its ladder; everything else stays the node's."""
    kept = [f for f in health.findings
            if not (gpu_index(f.component) == index and f.code in local)]  # fmt: skip
    status = Status.worst(f.status for f in kept)
    return health.model_copy(update={"findings": kept, "status": status})


def decide_gpu(
    record: Isolation | None,
    *,
    node: str,
    problems: Sequence[FindingSummary],
    local: frozenset[str],
    enforced: bool,
    holders: Sequence[str] | None,
    uuids: Mapping[int, str],
    result: AgentResult | None = None,
    scope_kind: Scope = "device-plugin",
    reset_supported: bool = True,
    now: datetime,
    config: GpuConfig | None = None,
) -> GpuDecision:
    """One pass of the GPU's ladder for `node`.

    `problems`: the node's blocking findings (`problems_of`); `enforced`: the cluster
    keeps new work off the GPU (device plugin: allocatable below capacity); `holders`:
    the pods or jobs holding the GPU (None: unknown); `uuids`: index -> uuid of the GPUs
    now; `result`: the agent's latest remediation answer; `reset_supported`: the cluster
    can reset one GPU (Slurm cannot: its reset is a node reboot), else the GPU is isolated
    as soon as nobody holds it.
    """
    cfg = config or GpuConfig()
    fault = scope(problems, local=local)
    if record is None:
        return _start(node, fault, problems, local=local, enforced=enforced, holders=holders,
                      uuids=uuids, scope_kind=scope_kind, now=now, config=cfg,
                      reset=reset_supported)  # fmt: skip
    rec = record

    def give_back(why: str) -> GpuDecision:  # the node's ladder takes over, fail closed
        return GpuDecision(None, False, f"gpu:{rec.index} back to the whole node: {why}",
                           store=True, escalated=True)  # fmt: skip

    now_uuid = uuids.get(rec.index)
    if now_uuid and now_uuid != rec.gpu_uuid:  # the board was replaced
        return GpuDecision(None, False, f"gpu:{rec.index} replaced ({rec.gpu_uuid} -> "
                           f"{now_uuid}): isolation released", store=True)  # fmt: skip
    others = [p for p in problems
              if not (gpu_index(p.component) == rec.index and p.code in local)]  # fmt: skip
    if others:  # a second bad GPU, or a fault of the node's: the whole node's ladder
        why = why_whole_node(problems, local=local) or f"{others[0].code} on gpu:{rec.index}"
        return give_back(why)
    if not enforced:  # e.g. a device-plugin restart marked every GPU healthy again
        return give_back(
            "the cluster no longer keeps work off it (a device plugin "
            "restart? its DeviceTaintRule gone?)"
        )
    if fault is None:  # the GPU's findings cleared
        if rec.step == "resetting" and _answered(rec, result, ok=True):
            ep = _episode(rec, now=now, outcome="cured:RESET_GPU", reset=True)
            return GpuDecision(None, False, f"gpu:{rec.index} cured by its reset",
                               store=True, episode=ep)  # fmt: skip
        return GpuDecision(None, False, f"gpu:{rec.index} cleared: isolation released",
                           store=True)  # fmt: skip
    if rec.step == "evicting":
        if holders is None:
            return give_back("who holds the GPU is no longer known")
        if holders:
            grace = cfg.fatal_grace_s if fault.fatal else cfg.suspect_grace_s
            if (now - rec.since).total_seconds() < grace:
                return GpuDecision(rec, True, f"{rec.reason}: {len(holders)} holder(s) "
                                   f"evicted after {grace:.0f} s")  # fmt: skip
            deadline = rec.since + timedelta(seconds=grace + cfg.evict_timeout_s)
            op = GpuOp("evict", rec.index, holders=tuple(holders), deadline=deadline)
            return GpuDecision(rec, True, f"evicting {len(holders)} holder(s) of "
                               f"gpu:{rec.index}", (op,))  # fmt: skip
        return _after_evict(rec, fault, now, reset=reset_supported)
    if rec.step == "resetting":
        step_age = (now - (rec.step_since or rec.since)).total_seconds()
        if _answered(rec, result, ok=False):
            return _isolate(rec, now, f"reset of gpu:{rec.index} failed: {result.detail}"
                            if result else "reset failed", reset=True)  # fmt: skip
        if _answered(rec, result, ok=True):
            return _isolate(rec, now, f"{fault.code} persists after the reset", reset=True)
        if step_age >= cfg.reset_timeout_s:
            return _isolate(rec, now, f"reset of gpu:{rec.index} timed out", reset=True)
        if rec.issued != rec.request_id:
            op = GpuOp("reset", rec.index, request_id=rec.request_id)
            return GpuDecision(rec, True, f"resetting gpu:{rec.index}", (op,))
        return GpuDecision(rec, True, f"waiting for the reset of gpu:{rec.index}")
    return GpuDecision(rec, True, rec.reason)  # isolated: until replaced or cleared


def _start(
    node: str,
    fault: GpuFault | None,
    problems: Sequence[FindingSummary],
    *,
    local: frozenset[str],
    enforced: bool,
    holders: Sequence[str] | None,
    uuids: Mapping[int, str],
    scope_kind: Scope,
    now: datetime,
    config: GpuConfig,
    reset: bool = True,
) -> GpuDecision:
    if fault is None:
        return GpuDecision(None, False, why_whole_node(problems, local=local))
    where = f"gpu:{fault.index}"
    if not enforced:
        return GpuDecision(None, False, f"{fault.code} on {where}: the cluster still offers "
                           "the GPU (device plugin disagrees): whole node")  # fmt: skip
    if holders is None:
        return GpuDecision(None, False, f"{fault.code} on {where}: who holds the GPU is "
                           "unknown: whole node")  # fmt: skip
    uuid = uuids.get(fault.index)
    if not uuid:
        return GpuDecision(None, False, f"{fault.code} on {where}: its uuid is unknown: "
                           "whole node")  # fmt: skip
    rec = Isolation(node=node, gpu_uuid=uuid, index=fault.index, since=now, step_since=now,
                    scope=scope_kind, code=fault.code,
                    reason=f"{fault.code}: {where} out of service")  # fmt: skip
    if holders:
        d = decide_gpu(rec, node=node, problems=problems, local=local, enforced=True,
                       holders=holders, uuids=uuids, now=now, config=config)  # fmt: skip
        return GpuDecision(rec, True, d.reason, d.ops, store=True)
    d = _after_evict(rec, fault, now, reset=reset)
    return GpuDecision(d.record, True, d.reason, d.ops, store=True, episode=d.episode)


def _after_evict(rec: Isolation, fault: GpuFault, now: datetime, *, reset: bool) -> GpuDecision:
    """Nobody holds the GPU: reset it, unless its fault needs a new GPU or the cluster
    cannot reset one GPU."""
    if fault.action.rank >= Action.REPLACE.rank:
        return _isolate(rec, now, f"{fault.code} needs a new GPU", reset=False)
    if not reset:
        return _isolate(rec, now, f"{fault.code}: no per-GPU reset here", reset=False)
    rid = _request_id(rec.node, rec.index, now)
    nxt = rec.model_copy(update={"step": "resetting", "step_since": now, "request_id": rid})
    op = GpuOp("reset", rec.index, request_id=rid)
    return GpuDecision(nxt, True, f"resetting gpu:{rec.index}", (op,), store=True)


def _isolate(rec: Isolation, now: datetime, why: str, *, reset: bool) -> GpuDecision:
    reason = f"{why}: gpu:{rec.index} isolated until replaced"
    nxt = rec.model_copy(update={"step": "isolated", "step_since": now, "reason": reason})
    ep = _episode(rec, now=now, outcome="gpu-isolated", reset=reset)
    return GpuDecision(nxt, True, reason, store=True, episode=ep)


def _answered(rec: Isolation, result: AgentResult | None, *, ok: bool) -> bool:
    return result is not None and result.request_id == rec.request_id and (result.succeeded is ok)
