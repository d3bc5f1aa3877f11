"""Node-time per time bucket, for the "availability over time" plot of the report.

Used by `observe.slo`. With a known window the bucket width is window/120; without one
it starts at an hour and doubles (merging neighbours) whenever more than `MAX_BUCKETS`
exist, so memory stays bounded however long the log spans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

POINTS = 120
MAX_BUCKETS = 2048
DEFAULT_WIDTH_S = 3600.0


@dataclass
class Timeline:
    start: float | None = None
    end: float | None = None
    width_s: float = 0.0
    # bucket index -> [node_s, in_service_s, maintenance_s]
    buckets: dict[int, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.width_s:
            known = self.start is not None and self.end is not None and self.end > self.start
            span = (self.end - self.start) if known else 0.0  # type: ignore[operator]
            self.width_s = span / POINTS if known else DEFAULT_WIDTH_S

    def add(self, a: float, b: float, *, in_service: bool, maintenance: bool) -> None:
        """Spread the interval [a, b) over the buckets it touches."""
        w = self.width_s
        i = math.floor(a / w)
        while a < b:
            edge = min(b, (i + 1) * w)
            row = self.buckets.setdefault(i, [0.0, 0.0, 0.0])
            d = edge - a
            row[0] += d
            if maintenance:
                row[2] += d
            elif in_service:
                row[1] += d
            a, i = edge, i + 1
        if len(self.buckets) > MAX_BUCKETS:
            self._coarsen()

    def _coarsen(self) -> None:
        """Double the width: bucket k of width w lies in bucket k // 2 of width 2w."""
        merged: dict[int, list[float]] = {}
        for k, row in self.buckets.items():
            into = merged.setdefault(k // 2, [0.0, 0.0, 0.0])
            for j, v in enumerate(row):
                into[j] += v
        self.buckets = merged
        self.width_s *= 2

    def series(self, *, points: int = POINTS) -> list[dict[str, Any]]:
        """[{t, availability}] in time order, adjacent buckets merged down to `points`."""
        if not self.buckets:
            return []
        keys = sorted(self.buckets)
        step = max(1, math.ceil((keys[-1] - keys[0] + 1) / points))
        merged: dict[int, list[float]] = {}
        for k in keys:
            row = merged.setdefault(k // step, [0.0, 0.0, 0.0])
            for j, v in enumerate(self.buckets[k]):
                row[j] += v
        out = []
        for g in sorted(merged):
            node_s, up_s, maint_s = merged[g]
            den = node_s - maint_s
            out.append(
                {
                    "t": g * step * self.width_s,
                    "width_s": step * self.width_s,
                    "availability": None if den <= 0 else round(up_s / den, 6),
                }
            )
        return out
