"""When the controller saw each report change: freshness on the controller's own clock.

A node's agent dates its health summary by its own clock, and a preflight run is dated by
whoever wrote its result. Judged against the controller's clock alone, an agent 6 s ahead
(past `core.freshness.MAX_CLOCK_SKEW_S`) reads as "from the future" and a controller 300 s
ahead reads every report as stale: every node unreadable, every pool's stale cause open, a
real fatal fault never blocked. So, as the leader election judges a Lease by when it saw
the Lease change and not by the holder's timestamp, the controller dates a report by when
it saw it change: a stamp it has not seen before, that could not have been written between
the previous pass and this one by a clock that agrees with its own, is dated now. A stamp
seen before keeps the date it got then (a dead agent's report ages on the controller's
clock however its clock was set). A report seen for the first time (a new node, a
restarted controller) keeps its own stamp unless that lies in the future.

The difference is the clock skew, exported (`gpuvigil_agent_clock_skew_max_seconds`,
`gpuvigil_agent_clock_skewed_nodes`) and alerted on: skew is a fault of the node's time
service, never a reason to go blind. Pure apart from its memory (takes `now`); used by
`platform.controller` once per pass, before anything judges a node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableSequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuvigil.core.freshness import MAX_CLOCK_SKEW_S
from gpuvigil.platform.state import NodeView


@dataclass(frozen=True)
class _Seen:
    stamp: datetime  # what the writer said
    at: datetime  # when the controller takes it to be from


@dataclass
class Skew:
    """This pass's skew figures (seconds; positive: the writers' clocks are ahead)."""

    max_s: float = 0.0  # the largest skew seen, by magnitude (a lower bound)
    nodes: int = 0  # nodes whose latest report showed more than the tolerance
    worst: str = ""  # the node it was seen on


class Observed:
    def __init__(self, *, tolerance_s: float = MAX_CLOCK_SKEW_S) -> None:
        self.tolerance = timedelta(seconds=tolerance_s)
        self._beats: dict[str, _Seen] = {}
        self._preflights: dict[str, _Seen] = {}
        self._skew: dict[str, float] = {}  # node -> skew of its latest changed report
        self._last: datetime | None = None
        self.skew = Skew()

    def _date(self, memo: dict[str, _Seen], name: str, stamp: datetime, now: datetime) -> datetime:
        seen = memo.get(name)
        if seen is not None and seen.stamp == stamp:
            return seen.at
        after = self._last if seen is not None else None  # first sight: no lower bound
        ahead = (stamp - now).total_seconds()
        behind = (after - stamp).total_seconds() if after is not None else 0.0
        limit = self.tolerance.total_seconds()
        plausible = ahead <= limit and behind <= limit
        at = min(stamp, now) if plausible else now
        if seen is not None or ahead > 0:
            self._skew[name] = ahead if ahead > 0 else -max(0.0, behind)
        memo[name] = _Seen(stamp, at)
        return at

    def apply(self, nodes: MutableSequence[NodeView], now: datetime) -> None:
        """Redate each node's heartbeat and preflight in place (the list may carry more
        than its items: the simulator's knows the fleet's census)."""
        for i, v in enumerate(nodes):
            changes: dict[str, object] = {}
            if v.heartbeat_at is not None:
                at = self._date(self._beats, v.name, v.heartbeat_at, now)
                if at != v.heartbeat_at:
                    changes["heartbeat_at"] = at
            if v.preflight is not None:
                at = self._date(self._preflights, v.name, v.preflight.at, now)
                if at != v.preflight.at:
                    changes["preflight"] = dataclasses.replace(v.preflight, at=at)
            if changes:
                nodes[i] = dataclasses.replace(v, **changes)  # type: ignore[arg-type]
        if len(self._beats) > len(nodes) or len(self._preflights) > len(nodes):
            present = {v.name for v in nodes}
            for memo in (self._beats, self._preflights, self._skew):
                for gone in [k for k in memo if k not in present]:
                    del memo[gone]  # type: ignore[attr-defined]
        self._last = now
        self._summarise()

    def _summarise(self) -> None:
        limit = self.tolerance.total_seconds()
        skew = Skew()
        for name, s in self._skew.items():
            if abs(s) > limit:
                skew.nodes += 1
            if abs(s) > abs(skew.max_s):
                skew.max_s, skew.worst = s, name
        self.skew = skew
