"""What `gpuvigil replay` predicted against what the event log recorded, and why they differ.

Called by `commands/replay.py` when the input is an event log that holds the controller's
own decisions (`node.state`, `remediation`, `breaker` events from source `controller`).
The counts of each kind of decision are compared; every node whose remediation steps
differ is explained by the first cause that fits, checked in this order:

- budget: one side held a step (disruption budget, rate limit, cooldown, breaker) that the
  other took: safety decided differently, usually because the fleet or the budget differs;
- timing: the prediction validated the node before the history says its findings cleared
  (replay assumes a reset takes 300 s, a reboot 1,200 s and preflight 600 s), so it judged
  the step a failure and went on to the next one; or the reverse;
- people: a person released a quarantined node in the record, which replay does not model;
- policy: the first step on the same findings differs (another `controller:` policy, or
  catalog, than the one that ran).

Pure: takes the replay's decisions and the log's events, returns the comparison.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuvigil.core.events import Event, Kind

BUDGET, TIMING, POLICY, PEOPLE = "budget", "timing", "policy", "people"
REASONS = {
    PEOPLE: "a person released a QUARANTINED node in the record (gpuvigil release); replay "
    "models no people, so the node stays quarantined",
    BUDGET: "safety held a step on one side only (budget, rate, cooldown or breaker)",
    TIMING: "the prediction validated the node before the history cleared its findings "
    "(replay times a reset 300 s, a reboot 1,200 s, preflight 600 s), so it took the next step",
    POLICY: "the first step on the same findings differs (another policy or catalog)",
}
HOLD_WORDS = ("budget", "rate", "cooldown", "breaker", "held")


def counts(decisions: Iterable[dict[str, Any]]) -> Counter[str]:
    """Steps started per action, and transitions per target state."""
    c: Counter[str] = Counter()
    for d in decisions:
        if d["kind"] == Kind.NODE_STATE.value:
            c[f"to {d.get('to')}"] += 1
        elif d["kind"] == Kind.REMEDIATION.value and d.get("result") == "started":
            c[str(d.get("action"))] += 1
        elif d["kind"] == Kind.REMEDIATION.value and d.get("result") == "skipped":
            c["held or left alone"] += 1
        elif d["kind"] == Kind.BREAKER.value and d.get("state") == "open":
            c["breaker trips"] += 1
    return c


def recorded(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The controller's decisions in the log, in the replay's form (its state announcements,
    `from: null`, are not decisions)."""
    out = []
    for ev in events:
        if ev.source != "controller" or ev.kind not in (
            Kind.NODE_STATE,
            Kind.REMEDIATION,
            Kind.BREAKER,
        ):
            continue
        if ev.kind == Kind.NODE_STATE and ev.data.get("from") is None:
            continue
        out.append({"ts": ev.ts, "node": ev.node, "kind": ev.kind, **ev.data})
    return out


@dataclass(frozen=True)
class NodeDiff:
    node: str
    predicted: tuple[str, ...]  # steps started, in order
    recorded: tuple[str, ...]
    why: str  # BUDGET | TIMING | POLICY
    detail: str


@dataclass
class Comparison:
    predicted: Counter[str] = field(default_factory=Counter)
    recorded: Counter[str] = field(default_factory=Counter)
    nodes: list[NodeDiff] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return sorted(set(self.predicted) | set(self.recorded))

    def by_cause(self) -> Counter[str]:
        return Counter(n.why for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": {
                k: {"predicted": self.predicted.get(k, 0), "recorded": self.recorded.get(k, 0)}
                for k in self.keys
            },
            "nodes_differing": len(self.nodes),
            "by_cause": dict(self.by_cause()),
            "causes": REASONS,
            "nodes": [
                {
                    "node": n.node,
                    "predicted": list(n.predicted),
                    "recorded": list(n.recorded),
                    "why": n.why,
                    "detail": n.detail,
                }
                for n in self.nodes
            ],
        }


def _steps(decisions: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(
        str(d.get("action"))
        for d in decisions
        if d["kind"] == Kind.REMEDIATION.value and d.get("result") == "started"
    )


def _states(decisions: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(str(d.get("to")) for d in decisions if d["kind"] == Kind.NODE_STATE.value)


def _held(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        d
        for d in decisions
        if d["kind"] == Kind.REMEDIATION.value
        and d.get("result") == "skipped"
        and any(w in str(d.get("reason", "")).lower() for w in HOLD_WORDS)
    ]


def _failed_validations(decisions: list[dict[str, Any]]) -> list[float]:
    return [
        d["ts"]
        for d in decisions
        if d["kind"] == Kind.NODE_STATE.value and "validation failed" in str(d.get("reason", ""))
    ]


def explain(
    node: str,
    predicted: list[dict[str, Any]],
    recorded_: list[dict[str, Any]],
    *,
    cleared_at: list[float],
) -> NodeDiff | None:
    """Why one node's steps differ, or None when they do not."""
    p, r = _steps(predicted), _steps(recorded_)
    sp, sr = _states(predicted), _states(recorded_)
    if p == r and sp == sr:
        return None
    if sp[-1:] == ("QUARANTINED",) and "QUARANTINED" in sr and sr[-1:] != ("QUARANTINED",):
        return NodeDiff(
            node,
            p,
            r,
            PEOPLE,
            "quarantined in both; back in service only in the "
            f"record ({' -> '.join(sr[sr.index('QUARANTINED') :])})",
        )
    hp, hr = _held(predicted), _held(recorded_)
    if bool(hp) != bool(hr):
        side, held = ("the prediction", hp) if hp else ("the record", hr)
        return NodeDiff(node, p, r, BUDGET, f"{side} held a step: {held[0].get('reason', '')}")
    for side, decisions in (("the prediction", predicted), ("the record", recorded_)):
        for ts in _failed_validations(decisions):
            later = [c for c in cleared_at if c > ts]
            if later:
                return NodeDiff(
                    node,
                    p,
                    r,
                    TIMING,
                    f"{side} validated at {ts:.0f} and found the problem still "
                    f"there; the history clears it {later[0] - ts:,.0f} s later",
                )
    if p[:1] != r[:1]:
        return NodeDiff(
            node,
            p,
            r,
            POLICY,
            f"first step {p[0] if p else 'none'} predicted, {r[0] if r else 'none'} recorded",
        )
    return NodeDiff(node, p, r, TIMING, "the same first step; a later one differs in time")


def compare(
    predicted: list[dict[str, Any]], recorded_: list[dict[str, Any]], events: Iterable[Event]
) -> Comparison:
    """Every node whose steps differ, explained; and the counts on both sides."""
    cleared: dict[str, list[float]] = {}
    for ev in events:
        if ev.kind == Kind.FINDING_CLEARED and ev.node is not None:
            cleared.setdefault(ev.node, []).append(ev.ts)
    by_p: dict[str, list[dict[str, Any]]] = {}
    by_r: dict[str, list[dict[str, Any]]] = {}
    for d in predicted:
        by_p.setdefault(str(d.get("node")), []).append(d)
    for d in recorded_:
        by_r.setdefault(str(d.get("node")), []).append(d)
    out = Comparison(predicted=counts(predicted), recorded=counts(recorded_))
    for node in sorted((set(by_p) | set(by_r)) - {"None"}):
        diff = explain(
            node, by_p.get(node, []), by_r.get(node, []), cleared_at=cleared.get(node, [])
        )
        if diff is not None:
            out.nodes.append(diff)
    return out
