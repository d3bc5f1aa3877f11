"""Straggler statistics: leave-one-out median, thresholds, consecutive windows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.training.config import StragglerConfig
from gpuvigil.training.straggler import Detector

CFG = StragglerConfig(factor=1.5, min_excess_s=0.005, windows=3, of_windows=3)


def detector(n: int, cfg: StragglerConfig = CFG) -> Detector:
    return Detector(cfg, nodes=[f"node{i}" for i in range(n)])


def test_slow_rank_reported_after_m_windows_once_per_streak() -> None:
    d = detector(4)
    times = [0.010, 0.011, 0.030, 0.010]
    assert d.observe(times, step=10) == []
    assert d.observe(times, step=20) == []
    (s,) = d.observe(times, step=30)
    assert (s.rank, s.node, s.step, s.windows) == (2, "node2", 30, 3)
    assert abs(s.ratio - 0.030 / 0.010) < 1e-9
    assert d.observe(times, step=40) == []  # same streak: not reported again


def test_streak_resets_when_the_rank_recovers() -> None:
    d = detector(3)
    slow, ok = [0.01, 0.01, 0.05], [0.01, 0.01, 0.01]
    for times in (slow, slow, ok, slow, slow):
        assert d.observe(times, step=0) == []
    assert [s.rank for s in d.observe(slow, step=0)] == [2]


def test_intermittent_slowness_is_reported_m_of_n() -> None:
    """Slow in 3 of every 5 windows: never 3 in a row, still a straggler."""
    d = detector(2, StragglerConfig(factor=1.2, min_excess_s=0.001, windows=3, of_windows=5))
    slow, ok = [0.010, 0.013], [0.010, 0.010]
    found = [s for times in (slow, ok, slow, ok, slow) for s in d.observe(times, step=0)]
    assert [(s.rank, s.windows) for s in found] == [(1, 3)]


def test_a_rank_1_3x_slower_is_named_with_the_defaults() -> None:
    d = detector(4, StragglerConfig())
    found = []
    for w in range(1, 11):  # every_steps=10: 100 steps
        found += d.observe([0.100, 0.100, 0.130, 0.101], step=w * 10)
    assert [(s.rank, s.step) for s in found] == [(2, 30)]


def test_two_ranks_use_the_other_rank_not_the_mean() -> None:
    d = detector(2, StragglerConfig(windows=1))
    # The median of both would be 0.035: 0.06 is not 1.5x that; it is 6x its peer.
    assert [s.rank for s in d.observe([0.01, 0.06], step=1)] == [1]


def test_small_absolute_differences_are_jitter() -> None:
    d = detector(2, StragglerConfig(windows=1, min_excess_s=0.005))
    assert d.observe([0.001, 0.004], step=1) == []  # 4x, but only 3 ms


def test_single_rank_never_straggles() -> None:
    assert detector(1, StragglerConfig(windows=1)).observe([5.0], step=1) == []


@given(st.integers(2, 64), st.floats(0.001, 10.0), st.lists(st.floats(0.9, 1.1), min_size=64))
def test_uniform_ranks_are_never_reported(n: int, base: float, jitter: list[float]) -> None:
    d = detector(n, StragglerConfig(windows=1))
    assert d.observe([base * j for j in jitter[:n]], step=1) == []


@given(st.integers(3, 64), st.integers(0, 63), st.floats(0.01, 1.0))
def test_one_much_slower_rank_is_the_only_one_reported(n: int, who: int, base: float) -> None:
    who %= n
    d = detector(n, StragglerConfig(windows=1))
    times = [base] * n
    times[who] = base * 3
    assert [s.rank for s in d.observe(times, step=1)] == [who]
