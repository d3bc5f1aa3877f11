"""The controller's per-GPU path: read what the GPU's ladder needs, decide, apply.

Called by `platform.controller` for every node, before the node's own policy, on adapters
that can take one GPU out of service (`clusters.base.GpuIsolating`: Kubernetes with the
device plugin or DRA, Slurm's degraded node). The judgement is
`platform.isolation.decide_gpu` (pure); this module does the reads it needs (who holds the
GPU: only for a node with a GPU-local fault) and the writes it asks for, in this order:
the record first (so a killed controller resumes from it), then the cluster's own
enforcement if it has one, then the evictions or the reset. It never blocks the node: the
device plugin keeps new work off the GPU (allocatable below capacity), or, with DRA, the
controller's DeviceTaintRule does (`clusters.k8s_dra`: effect None as a dry run, then
NoSchedule; never NoExecute, whose evictions pass PDBs: the holders ResourceClaims name are
evicted here, through the Eviction API). A rule refused or failed hands the node to its
whole ladder, as does a rule found gone; a record deleted (released, or given back)
deletes its rule first.

The node's own policy then judges the node without the isolated GPU's own GPU-local
findings (`policy.values.assess` reads the record from `NodeView.isolation_text`), so a
node with one isolated GPU stays HEALTHY and in service; anything else on it (a second
bad GPU, an NVLink fault, a device-plugin restart) ends the isolation here first, and the
node's ladder takes over in the same pass.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from functools import lru_cache

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.events import Kind
from gpuvigil.core.findings import Action
from gpuvigil.platform import isolation as iso
from gpuvigil.platform.announce import Announcer
from gpuvigil.platform.capacity import StepKind
from gpuvigil.platform.clusters.base import (
    Cluster,
    ClusterError,
    Fenced,
    GpuIsolating,
    NodeView,
)
from gpuvigil.platform.policy import Fleet, PolicyConfig, assess
from gpuvigil.platform.serving_hook import ServingGuard, gpu_step
from gpuvigil.platform.state import State

log = logging.getLogger("gpuvigil.controller")


class IsolationConfig(StrictModel):
    """`controller.isolation:` per-GPU isolation (docs/controller.md "Per-GPU isolation")."""

    enabled: bool = True  # off: every fault takes the whole node's ladder, as before
    evict_timeout_s: float = Field(900.0, ge=0)  # holders left after this are removed
    reset_timeout_s: float = Field(600.0, gt=0)  # no answer to the GPU's reset: isolated


@lru_cache(maxsize=32)
def _isolating(kind: type) -> bool:
    """Whether an adapter class has the per-GPU methods: once per class (a protocol check
    per node per pass cost 20 µs each, a third of a quiet pass over 5,000 nodes)."""
    return issubclass(kind, GpuIsolating)


def enforced(node: NodeView) -> bool:
    """The device plugin agrees a GPU is gone: allocatable below capacity."""
    cap, alloc = node.gpu_capacity, node.gpu_allocatable
    return cap is not None and alloc is not None and alloc < cap


def gpu_pass(
    cluster: Cluster,
    node: NodeView,
    *,
    fleet: Fleet,
    now: datetime,
    policy: PolicyConfig,
    config: IsolationConfig,
    voice: Announcer,
    guard: ServingGuard | None = None,
) -> NodeView:
    """Run the GPU's ladder for `node` once; returns the view the node's policy should
    judge (with the isolation record as now stored). ClusterErrors propagate: the
    controller skips the node this pass (the record on the node says where it was)."""
    if not config.enabled or not _isolating(type(cluster)):
        return node
    rec = iso.decode_isolation(node.isolation_text)
    if rec is None and (node.health is None or not node.health.findings):
        return node  # the common case, every pass on every node: nothing to look at
    if rec is None and node.record is not None and node.record.state is not State.HEALTHY:
        return node  # the node's ladder is running: it owns the node until it ends
    if rec is None and node.blocked_by_someone_else and not policy.act_on_foreign_blocked:
        return node  # someone else's block (maintenance): the node's policy leaves it alone
    # every problem, the isolated GPU's included (the node's policy is the one that
    # leaves those out)
    whole = dataclasses.replace(node, isolation_text=None)
    a = assess(whole, now=now, config=policy, held=fleet.held)
    if not a.readable:
        return node  # act on nothing we could not read; the record stays as it is
    local = iso.gpu_local_codes()
    problems = list(a.problems)
    fault = iso.scope(problems, local=local)
    if rec is None and fault is None:
        return node
    uuids = iso.uuids_of(problems)
    target = rec.gpu_uuid if rec is not None else uuids.get(fault.index) if fault else None
    # DRA's way where the cluster has one for this GPU (its own DeviceTaintRule)
    ask = getattr(cluster, "gpu_enforcement", None)
    way = ask(node, target, plugin_agrees=enforced(node), record=rec) if ask and target else None
    if way is not None:
        ok, scope_kind = way.enforced, way.scope
        holders = way.holders if ok else None
    else:
        # the cluster's own word where it has one (Slurm: the degrade procedure, verified)
        gpu_enforced = getattr(cluster, "gpu_enforced", None)
        ok = gpu_enforced(node) if gpu_enforced is not None else enforced(node)
        holders = cluster.gpu_holders(node.name, target) if target and ok else None
        scope_kind = getattr(cluster, "isolation_scope", "device-plugin")
    gcfg = iso.GpuConfig(
        fatal_grace_s=policy.fatal_grace_s,
        suspect_grace_s=policy.suspect_grace_s,
        evict_timeout_s=config.evict_timeout_s,
        reset_timeout_s=config.reset_timeout_s,
    )
    d = iso.decide_gpu(rec, node=node.name, problems=problems, local=local, enforced=ok,
                       holders=holders, uuids=uuids, result=node.agent_result, now=now,
                       config=gcfg, scope_kind=scope_kind,
                       reset_supported=getattr(cluster, "gpu_reset_supported", True))  # fmt: skip
    if rec is None and not d.per_gpu:  # the node's ladder decides and says why it acts
        log.debug("node %s: whole node: %s", node.name, d.reason)
        return node
    text = node.isolation_text
    if d.store:
        new = d.record is not None and rec is None
        if new and way is not None and d.record is not None:  # the device its rule selects
            d = dataclasses.replace(d, record=d.record.model_copy(update={"device": way.device}))
        if d.record is None and rec is not None:
            _release(cluster, node.name, rec)  # first: a rule never outlives its record
        text = d.record.encode() if d.record is not None else None
        cluster.store_isolation(node.name, text)
        _announce(voice, node.name, rec, d, now)
        if new and not _enforce(cluster, node, d.record, now=now, voice=voice):
            return dataclasses.replace(node, isolation_text=None)  # the node's ladder now
    if d.episode is not None:  # the machine's memory, on the node's own record
        cluster.store(node.name, iso.remember(node.record, d.episode))
    for op in d.ops:
        # the serving capacity gate before the GPU's holders go or it resets: a held op is
        # skipped, and the record, kept, asks for it again next pass
        if guard is not None and d.record is not None and op.kind in ("evict", "reset"):
            kind = StepKind.EVICT_GPU if op.kind == "evict" else StepKind.RESET_GPU
            step = gpu_step(node, kind, d.record.gpu_uuid, bypass_codes=guard.config.bypass_codes)
            if not guard.allow_step(node, step, what=f"{op.kind} gpu:{op.index}", now=now):
                continue
        if op.kind == "evict":
            assert op.deadline is not None
            st = cluster.evict(node.name, list(op.holders), deadline=op.deadline,
                               reason=f"gpuvigil: gpu:{op.index} isolated")  # fmt: skip
            if st.forced:
                why = f"{st.forced} holder(s) of gpu:{op.index} at the deadline"
                _remediation(voice, node.name, now, action="EVICT", result="forced", reason=why)
                # a disruption budget was overridden: people must hear of it
                voice.cluster_event(node.name, "GpuIsolation", f"{why} (past the PDB)", True)
            if guard is not None:
                guard.drained(node, st, now=now)
        elif op.kind == "reset" and d.record is not None:
            cluster.request(node.name, action=Action.RESET_GPU, request_id=op.request_id,
                            gpus=[op.index])  # fmt: skip
            # At least once: the agent acts once per id, so a resend after a crash is safe.
            text = d.record.model_copy(update={"issued": op.request_id}).encode()
            cluster.store_isolation(node.name, text)
    # The node's policy judges this pass with the record as stored now; the stored
    # version moved, so its own write (if any) re-reads first (a Conflict, as a heartbeat).
    return dataclasses.replace(node, isolation_text=text)


def converge(cluster: Cluster, node: NodeView, *, config: IsolationConfig) -> None:
    """After `gpu_pass`: a cluster that enforces the record itself (`converge_isolation`:
    Slurm's degraded node) makes the node match it, every pass, a record or none."""
    match = getattr(cluster, "converge_isolation", None)
    if config.enabled and match is not None:
        match(node.name, node.isolation_text)


def _enforce(
    cluster: Cluster, node: NodeView, rec: iso.Isolation | None, *, now: datetime,
    voice: Announcer,
) -> bool:  # fmt: skip
    """A new record is stored: the cluster's own enforcement, before any eviction (DRA:
    the DeviceTaintRule, None then NoSchedule). Refused or failed: fail closed, the rule
    and the record go and the node's ladder takes the node this pass."""
    apply = getattr(cluster, "enforce_gpu", None)
    if apply is None or rec is None:
        return True
    try:
        why = apply(node.name, rec)
    except Fenced:
        raise
    except ClusterError as e:
        why = f"writing it failed: {e}"
    if not why:
        return True
    reason = f"gpu:{rec.index} back to the whole node: its {rec.scope} isolation: {why}"
    log.warning("node %s: %s", node.name, reason)
    _release(cluster, node.name, rec)
    cluster.store_isolation(node.name, None)
    _remediation(voice, node.name, now, action="ISOLATE_GPU", result="whole-node", reason=reason)
    voice.cluster_event(node.name, "GpuIsolation", reason, True)
    return False


def _release(cluster: Cluster, name: str, rec: iso.Isolation) -> None:
    """The cluster's own enforcement of `rec` goes (DRA: its rule is deleted)."""
    release = getattr(cluster, "release_gpu", None)
    if release is not None:
        release(name, rec)


def _remediation(
    voice: Announcer, name: str, now: datetime, *, action: str, result: str, reason: str
) -> None:
    """A step of the GPU's ladder: its event, and its count in gpuvigil_remediations_total,
    which the dashboard's remediation panel shows, as for the node's ladder (the lab found
    the panel blind to the per-GPU path)."""
    if voice.metrics is not None:
        voice.metrics.remediations.labels(action, result).inc()
    voice.event(name, Kind.REMEDIATION, now, action=action, result=result, reason=reason)


def _announce(
    voice: Announcer, name: str, old: iso.Isolation | None, d: iso.GpuDecision, now: datetime
) -> None:
    rec = d.record
    step = rec.step if rec is not None else ("released" if not d.escalated else "whole-node")
    was = old.step if old is not None else "in-service"
    log.info("node %s: gpu %s -> %s: %s", name, was, step, d.reason)
    _remediation(voice, name, now, action="ISOLATE_GPU", result=step, reason=d.reason)
    warning = (rec is not None and rec.step == "isolated") or d.escalated
    voice.cluster_event(name, "GpuIsolation", d.reason, warning)
