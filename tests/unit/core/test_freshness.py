"""One freshness function: old is stale, missing is missing, and the future is never fresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuvigil.core.freshness import MAX_CLOCK_SKEW_S, Freshness, judge

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds_ago: float) -> datetime:
    return NOW - timedelta(seconds=seconds_ago)


def test_recent_is_fresh() -> None:
    assert judge(at(10), now=NOW, max_age_s=60).freshness is Freshness.FRESH
    assert judge(at(60), now=NOW, max_age_s=60).fresh


def test_old_is_stale() -> None:
    age = judge(at(61), now=NOW, max_age_s=60)
    assert age.freshness is Freshness.STALE
    assert age.describe() == "61 s old"


def test_missing() -> None:
    assert judge(None, now=NOW, max_age_s=60).freshness is Freshness.MISSING


def test_small_skew_is_tolerated() -> None:
    assert judge(at(-MAX_CLOCK_SKEW_S), now=NOW, max_age_s=60).fresh


def test_a_report_from_the_future_is_not_fresh() -> None:
    age = judge(at(-86400), now=NOW, max_age_s=60)
    assert age.freshness is Freshness.FUTURE
    assert not age.fresh
    assert "future" in age.describe()
