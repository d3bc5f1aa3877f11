"""Bounded-memory summaries of durations (MTTD, MTTR, restart loss) for the SLO report.

Used by `observe.slo`. A `Distribution` keeps count, sum, min and max exactly, and a
reservoir of at most `RESERVOIR` samples for percentiles and plots (exact below that size,
a uniform sample above it; the reservoir's generator is seeded so reports repeat).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

RESERVOIR = 10_000


@dataclass
class Distribution:
    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    samples: list[float] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)
        if len(self.samples) < RESERVOIR:
            self.samples.append(value)
            return
        j = self._rng.randrange(self.count)
        if j < RESERVOIR:
            self.samples[j] = value

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile over the reservoir (exact when count <= RESERVOIR)."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
        return ordered[rank]

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean_s": _r(self.mean),
            "p50_s": _r(self.quantile(0.5)),
            "p90_s": _r(self.quantile(0.9)),
            "p99_s": _r(self.quantile(0.99)),
            "min_s": _r(self.low if self.count else None),
            "max_s": _r(self.high if self.count else None),
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def budget_burn(achieved: float | None, target: float) -> float | None:
    """Fraction of the window's error budget consumed: (1 - achieved) / (1 - target).

    1.0 means the budget is exactly spent; it equals the average burn rate over the window.
    """
    if achieved is None or target >= 1.0:
        return None
    return max(0.0, 1.0 - achieved) / (1.0 - target)
