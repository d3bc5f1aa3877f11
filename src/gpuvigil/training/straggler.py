"""Straggler detection: which rank is persistently slower than its peers, and on which node.

`Detector` is pure (unit-tested) and fed by `run.Run`, which gathers every rank's mean
*local* step time every K steps with one tiny all-gather on a side group. Local time is the
part of a step no collective can hide: from the step's start until the model's forward
pass returns (data loading plus forward). Whole-step wall time cannot tell a slow rank from
its peers: with synchronous gradient all-reduce every rank waits for the slowest and all
report the same duration.

A rank is slow in a window when its local time exceeds `factor` times the median of the
*other* ranks' times (leave-one-out: with two ranks the median of both would be their mean)
and exceeds it by `min_excess_s`. It is reported after `windows` consecutive slow windows,
once per streak.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpuvigil.training.config import StragglerConfig


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    step: int
    local_s: float  # this rank's mean local step time in the last window
    peers_median_s: float
    ratio: float
    windows: int  # consecutive slow windows so far


class Detector:
    def __init__(self, config: StragglerConfig, *, nodes: Sequence[str]) -> None:
        self.config = config
        self.nodes = list(nodes)
        self.streaks = [0] * len(nodes)

    def observe(self, times_s: Sequence[float], *, step: int) -> list[Straggler]:
        """One window's per-rank mean local step times -> ranks newly reported as stragglers."""
        if len(times_s) != len(self.streaks):
            raise ValueError(f"expected {len(self.streaks)} ranks, got {len(times_s)}")
        if len(times_s) < 2:
            return []
        out = []
        for rank, t in enumerate(times_s):
            peers = statistics.median([x for r, x in enumerate(times_s) if r != rank])
            slow = t > self.config.factor * peers and t - peers >= self.config.min_excess_s
            self.streaks[rank] = self.streaks[rank] + 1 if slow else 0
            if self.streaks[rank] == self.config.windows:
                ratio = t / peers if peers > 0 else float("inf")
                out.append(
                    Straggler(rank, self.nodes[rank], step, t, peers, ratio, self.streaks[rank])
                )
        return out
