"""The HPA's demand under make-before-break's raised `minReplicas`: a real HPA clamps
`desiredReplicas` to `minReplicas`, so at our floor it reads our own scale-up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuvigil.platform.capacity import Demand, ScaleMark
from gpuvigil.platform.clusters.k8s_serving import decode_mark, encode_mark, under_floor

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
MARK = ScaleMark("gpu-1", 2, 4, T0, original_min=1, hpa_desired=4)


def hpa(min_replicas: int) -> dict[str, Any]:
    return {"spec": {"minReplicas": min_replicas, "maxReplicas": 8}}


def reading(n: int) -> Demand:
    return Demand("hpa/llm", n, T0)


def test_at_our_floor_the_demand_is_the_one_read_before_it() -> None:
    assert under_floor(reading(6), hpa(6), MARK) == reading(4)


def test_above_our_floor_the_hpa_speaks_again() -> None:
    assert under_floor(reading(7), hpa(6), MARK) == reading(7)


def test_without_our_floor_the_reading_stands() -> None:
    assert under_floor(reading(6), hpa(1), MARK) == reading(6)  # restored already
    assert under_floor(reading(6), hpa(6), ScaleMark("gpu-1", 2, 4, T0)) == reading(6)


def test_a_mark_without_the_earlier_reading_is_a_missing_signal() -> None:
    old = ScaleMark("gpu-1", 2, 4, T0, original_min=1)
    got = under_floor(reading(6), hpa(6), old)
    assert got.replicas is None and "minReplicas" in got.error


def test_the_mark_keeps_the_earlier_reading() -> None:
    assert decode_mark(encode_mark(MARK)) == MARK
