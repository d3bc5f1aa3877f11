"""What the controller publishes about each decision (`state.Intent`): the state decided,
why, what comes next, and what holds it back. Pure; no I/O.

Called by `platform.controller` once per node per pass (it publishes an intent only when
it changed, and never for a node that is healthy and has nothing published), and by the
dry-run controller to decide from the record it would have stored (`shadow`), so a dry run
walks the live controller's path instead of deciding HEALTHY -> SUSPECT forever.
`gpuvigil nodes` and `gpuvigil explain` show what it says.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from gpuvigil.platform.breaker import HELD
from gpuvigil.platform.policy import NEEDS_HUMAN, Decision, Op, OpKind, PolicyConfig
from gpuvigil.platform.state import Intent, NodeView, Record, State

# Words that say which safety mechanism holds a node (`Intent.held_by`), first match wins.
_HELD_BY = (
    ("disruption budget", "budget"),
    ("budget ledger", "budget"),
    ("rate limit", "rate"),
    ("cooldown", "cooldown"),
    ("replace", "capacity"),
    ("capacity", "capacity"),
    ("stale", "stale"),
    ("silent", "stale"),
    (HELD, "breaker"),
)


def held_by(held: str) -> str:
    """budget | rate | cooldown | capacity | stale | breaker for a held reason ("" none)."""
    low = held.lower()
    for words, kind in _HELD_BY:
        if words in low:
            return kind
    return "other" if held else ""


def _op_words(op: Op, node: NodeView) -> str:
    if op.kind is OpKind.BLOCK:
        return "block new work"
    if op.kind is OpKind.UNBLOCK:
        return "lift its block"
    if op.kind is OpKind.DRAIN:
        by = f" by {op.deadline.isoformat(timespec='seconds')}" if op.deadline else ""
        return f"drain its work{by}"  # not the count: the intent stays put while it drains
    if op.kind is OpKind.REQUEST:
        gpus = f" (gpus {','.join(map(str, op.gpus))})" if op.gpus else ""
        return f"ask the agent for {op.action.value if op.action else '?'}{gpus}"
    if op.kind is OpKind.REPLACE:
        return "give the machine back for replacement"
    return "run preflight again"  # REVALIDATE


def _at(since: datetime | None, seconds: float) -> str:
    if since is None:
        return ""
    return f" at {(since + timedelta(seconds=seconds)).isoformat(timespec='seconds')}"


def next_words(d: Decision, node: NodeView, config: PolicyConfig) -> str:
    """What the controller does (or, holding, would do) next for this node, in words."""
    ops = [_op_words(op, node) for op in d.ops if op.kind is not OpKind.BLOCK]
    if ops:
        return "; ".join(ops)
    rec = d.record
    if d.held:
        return "drain once safety allows" if rec.state is State.SUSPECT else "wait"
    if rec.state is State.SUSPECT:
        if rec.reason.startswith(NEEDS_HUMAN):
            return f"quarantine for a person{_at(rec.since, config.fatal_grace_s)}"
        if rec.reason.startswith("fatal"):
            return f"drain{_at(rec.since, config.fatal_grace_s)}"
        return f"drain if it persists{_at(rec.since, config.suspect_grace_s)}"
    if rec.state is State.DRAINING:
        return "a ladder step once drained"
    if rec.state is State.REMEDIATING:
        step = rec.step.value if rec.step else "the step"
        limits = {"RESET_GPU": config.reset_timeout_s, "REBOOT": config.reboot_timeout_s}
        fails = _at(rec.since, limits.get(step, config.replace_timeout_s))
        return f"wait for {step} (fails{fails})"
    if rec.state is State.VALIDATING:
        return "back in service on a fresh preflight pass and a healthy summary"
    if rec.state is State.QUARANTINED:
        return f"nothing: a person releases it (gpuvigil release {node.name})"
    return ""


def intent_of(
    node: NodeView, d: Decision, *, now: datetime, dry_run: bool, config: PolicyConfig
) -> Intent:
    return Intent(
        at=now,
        dry_run=dry_run,
        state=d.state,
        reason=d.reason or d.record.reason,
        next=next_words(d, node, config),
        held=d.held,
        held_by=held_by(d.held),
        record=d.record if dry_run else None,
    )


def quiet(intent: Intent) -> bool:
    """Nothing worth publishing on a node that has nothing published: healthy, nothing
    next, nothing held, and (dry run) no path walked."""
    rec = intent.record
    return (
        intent.state is State.HEALTHY
        and not intent.next
        and not intent.held
        and (rec is None or not rec.history)
    )


def shadow(node: NodeView) -> NodeView:
    """The node as the live controller would see it had the dry run acted: its record is
    the one the dry run published, and it is blocked where that record blocks. A dry-run
    intent published before a live controller took over is not used by that one (it
    never calls this)."""
    intent = node.intent
    if intent is None or not intent.dry_run or intent.record is None:
        return node
    rec: Record = intent.record
    return dataclasses.replace(
        node, record=rec, blocked_by_us=rec.state.blocks or node.blocked_by_us
    )
