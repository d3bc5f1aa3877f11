"""Making one node match its decision: store the record first, then the operations.

Called by `platform.controller` for each node whose decision stores a record or asks for
operations (concurrently where the adapter allows). Every write goes through the adapter,
which asks the controller's fence first (`clusters.base`), so a replica that lost the
lease stops here with `Fenced` and sends nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from gpuvigil.core.events import Kind
from gpuvigil.platform.announce import Announcer
from gpuvigil.platform.clusters.base import Cluster, Conflict, NodeView
from gpuvigil.platform.policy import Decision, Fleet, OpKind, PolicyConfig, decide
from gpuvigil.platform.state import Record

if TYPE_CHECKING:
    from gpuvigil.platform.serving_hook import ServingGuard


def apply(
    cluster: Cluster,
    node: NodeView,
    d: Decision,
    *,
    fleet: Fleet,
    now: datetime,
    policy: PolicyConfig,
    voice: Announcer,
    dry_run: bool,
    given_back: Callable[[NodeView, datetime], None] | None = None,
    guard: ServingGuard | None = None,
) -> Decision | None:
    """Apply `d` to `node`; on a Conflict (the node changed since it was read, e.g. a
    heartbeat) re-read it and apply a fresh decision instead. Returns the decision applied,
    or None when it was left to the next pass. ClusterErrors (Fenced among them) propagate."""
    try:
        _apply(cluster, node, d, now=now, voice=voice, dry_run=dry_run, given_back=given_back,
               guard=guard)  # fmt: skip
        return d
    except Conflict:
        fresh = cluster.get_node(node.name)
        again = decide(fresh, fleet=fleet, now=now, config=policy)
        if again.disruptive and not d.disruptive:
            return None  # its budget was not counted in this pass: the next pass decides
        _apply(cluster, fresh, again, now=now, voice=voice, dry_run=dry_run, given_back=given_back,
               guard=guard)  # fmt: skip
        return again


def _apply(
    cluster: Cluster,
    node: NodeView,
    d: Decision,
    *,
    now: datetime,
    voice: Announcer,
    dry_run: bool,
    given_back: Callable[[NodeView, datetime], None] | None,
    guard: ServingGuard | None = None,
) -> None:
    old = node.record or Record()
    if dry_run:
        if d.store:
            voice.transition(node, old, d, now)
        return
    ops = d.ops
    if d.store:
        # One write where the cluster allows: the record and the block together.
        block = any(op.kind is OpKind.BLOCK for op in ops)
        cluster.store(node.name, d.record, version=node.version, block=block)
        if block:
            ops = tuple(op for op in ops if op.kind is not OpKind.BLOCK)
        voice.transition(node, old, d, now)  # said once: only after the store held
    rec = d.record
    for op in ops:
        # The capacity gate before every disruptive step: a held step is skipped, and the
        # decision, kept, asks again next pass (platform.serving_hook).
        if guard is not None and not guard.allow(node, op, now=now):
            continue
        if op.kind is OpKind.BLOCK:
            cluster.block(node.name, reason=rec.tag())
        elif op.kind is OpKind.UNBLOCK:
            cluster.unblock(node.name)
        elif op.kind is OpKind.DRAIN:
            assert op.deadline is not None
            st = cluster.drain(node.name, deadline=op.deadline, reason=rec.reason)
            if guard is not None:
                guard.drained(node, st, now=now)
            if st.forced:
                voice.event(
                    node.name,
                    Kind.REMEDIATION,
                    now,
                    action="DRAIN",
                    result="forced",
                    reason=f"{st.forced} left at the deadline",
                )
        elif op.kind is OpKind.REPLACE:
            # At most once: remember it first (a replacement is not idempotent when it is
            # a hook); a crash right here leaves a timeout and a quarantine, not a repeat.
            cluster.store(node.name, rec.model_copy(update={"issued": op.request_id}))
            if given_back is not None:  # a replacement counts once a new machine joins
                given_back(node, now)
            cluster.replace(node.name, reason=rec.reason)
            if getattr(cluster, "replace_removes_node", False):
                voice.removed(node, rec, now)
        elif op.kind is OpKind.REVALIDATE:
            # At least once: revalidate deletes only preflight pods older than `since`,
            # so a repeat after a crash here never kills the fresh run.
            assert rec.since is not None
            cluster.revalidate(node.name, since=rec.since)
            cluster.store(node.name, rec.model_copy(update={"preflight_for": rec.since}))
        elif op.kind is OpKind.REQUEST:
            assert op.action is not None
            cluster.request(
                node.name, action=op.action, request_id=op.request_id, gpus=list(op.gpus)
            )
            # At least once: the agent acts once per id, so a resend after a crash is safe.
            cluster.store(node.name, rec.model_copy(update={"issued": op.request_id}))
