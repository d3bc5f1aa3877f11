"""Which nodes a reconcile pass must decide again: the controller's memo of no-op decisions.

A node whose inputs are what they were last pass (its `NodeView`, resourceVersion and
heartbeat included, and the `Fleet` safety gave it) keeps its decision while that decision
was a no-op and still holds. How long it holds is never assumed: the policy itself is asked
`recheck_s` ahead, once a node has been seen unchanged (a node that changes every pass
never pays for the look-ahead). The policy's answers move only at thresholds of time (a
grace, a timeout, a report's age), so the same answer at both ends of the interval is the
same answer throughout it.

Used by `platform.controller`; `gpuvigil_controller_decisions_total{kind}` counts both.
(A version that also looked past heartbeat-only changes, for the memory cluster whose
agents beat without changing anything else, cost the simulator more in look-aheads than
it saved: docs/performance.md.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuvigil.platform.policy import Decision, Fleet
from gpuvigil.platform.state import NodeView

Decide = Callable[[NodeView, datetime], Decision]


@dataclass(frozen=True)
class _Entry:
    view: NodeView
    fleet: Fleet
    decision: Decision
    until: datetime  # the policy gives the same no-op for these inputs until then


def _same(old: NodeView, new: NodeView) -> bool:
    if old is new:
        return True
    # cheap fields first: most changed views differ in one of them
    return old.version == new.version and old.heartbeat_at == new.heartbeat_at and old == new


class DecisionMemo:
    def __init__(self, *, recheck_s: float) -> None:
        self.recheck = timedelta(seconds=recheck_s)
        self._entries: dict[str, _Entry] = {}

    def get(self, node: NodeView, fleet: Fleet, now: datetime) -> Decision | None:
        e = self._entries.get(node.name)
        if e is not None and now < e.until and e.fleet == fleet and _same(e.view, node):
            return e.decision
        return None

    def put(self, node: NodeView, fleet: Fleet, now: datetime, d: Decision, decide: Decide) -> None:
        """Remember a fresh decision (`decide(view, t)` asks the policy at another time)."""
        if d.store or d.ops:
            self._entries.pop(node.name, None)
            return
        e = self._entries.get(node.name)
        until = now
        if e is not None and e.fleet == fleet and e.decision == d and _same(e.view, node):
            later = now + self.recheck  # seen unchanged: does the answer hold a while?
            if decide(node, later) == d:
                until = later
        self._entries[node.name] = _Entry(node, fleet, d, until)

    def forget_absent(self, present: set[str]) -> None:
        if len(self._entries) > len(present):
            self._entries = {k: v for k, v in self._entries.items() if k in present}
