"""Straggler detection: which rank is persistently slower than its peers, and on which node.

`Detector` is pure (unit-tested) and fed by `run.Run`, which gathers every rank's mean
**busy** step time every K steps with one tiny all-gather on a side group (started
asynchronously, read a window later). Busy time is the whole step's wall time, collectives
included, minus the time the rank waited for its peers there (`step_timing`): with
synchronous gradient all-reduce every rank's wall time equals the slowest rank's, but the
slowest rank is the one that waited least. A rank slow in data loading, forward, backward or
the optimizer step has the longer busy time.

A rank is slow in a window when its busy time exceeds `factor` times the median of the
*other* ranks' times (leave-one-out: with two ranks the median of both would be their mean)
and exceeds it by `min_excess_s`. It is reported once `windows` of its last `of_windows`
windows were slow (intermittent slowness counts too), and again only after a window in
which it was not slow.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from gpuvigil.training.config import StragglerConfig


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    step: int
    local_s: float  # this rank's mean busy step time in the last window
    peers_median_s: float
    ratio: float
    windows: int  # slow windows among the last of_windows


class Detector:
    def __init__(self, config: StragglerConfig, *, nodes: Sequence[str]) -> None:
        self.config = config
        self.nodes = list(nodes)
        n = max(config.of_windows, config.windows)
        self.history: list[deque[bool]] = [deque(maxlen=n) for _ in nodes]
        self.reported = [False] * len(nodes)

    def observe(self, times_s: Sequence[float], *, step: int) -> list[Straggler]:
        """One window's per-rank mean busy step times -> ranks newly reported as stragglers."""
        if len(times_s) != len(self.history):
            raise ValueError(f"expected {len(self.history)} ranks, got {len(times_s)}")
        if len(times_s) < 2:
            return []
        out = []
        for rank, t in enumerate(times_s):
            peers = statistics.median([x for r, x in enumerate(times_s) if r != rank])
            slow = t > self.config.factor * peers and t - peers >= self.config.min_excess_s
            hist = self.history[rank]
            hist.append(slow)
            if not slow:
                self.reported[rank] = False
                continue
            count = sum(hist)
            if count >= self.config.windows and not self.reported[rank]:
                self.reported[rank] = True
                ratio = t / peers if peers > 0 else float("inf")
                out.append(Straggler(rank, self.nodes[rank], step, t, peers, ratio, count))
        return out
