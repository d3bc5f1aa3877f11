"""Is a report recent enough to act on? One function, used wherever a report is read.

The controller (a node's health summary), `slurm-healthcheck`, `npd-plugin
--from-state-file` and the training health gate all judge a report by its own
`generated_at` against their clock. A report older than `max_age_s` is STALE. A report dated
ahead of `now` by more than `skew_s` is FUTURE: a writer with a wrong clock, or a forged
file, and without this check it would stay fresh forever after its writer died. Both are
unreadable: callers fail closed on anything but FRESH.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

# Clocks of one cluster agree within NTP's tens of milliseconds; a few seconds cover a node
# whose chrony is still converging after boot. More than this is a broken clock.
MAX_CLOCK_SKEW_S = 5.0

# The agent's state file (`core.wire.STATE_FILE`) is rewritten every
# `agent.publish_interval_s` (30 s) and at once on a change. 180 s is six missed writes, or
# a fast sweep that hit its 60 s deadline twice over: beyond that the agent is dead or stuck.
STATE_FILE_MAX_AGE_S = 180.0


class Freshness(StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    FUTURE = "future"
    MISSING = "missing"


@dataclass(frozen=True)
class Age:
    freshness: Freshness
    age_s: float | None  # negative when dated in the future; None when missing

    @property
    def fresh(self) -> bool:
        return self.freshness is Freshness.FRESH

    def describe(self) -> str:
        if self.freshness is Freshness.MISSING or self.age_s is None:
            return "no report"
        if self.freshness is Freshness.FUTURE:
            return f"dated {-self.age_s:.0f} s in the future (clock skew or forgery)"
        return f"{self.age_s:.0f} s old"


def judge(
    generated_at: datetime | None,
    *,
    now: datetime,
    max_age_s: float,
    skew_s: float = MAX_CLOCK_SKEW_S,
) -> Age:
    """Pure: FRESH only when `now - max_age_s <= generated_at <= now + skew_s`."""
    if generated_at is None:
        return Age(Freshness.MISSING, None)
    age_s = (now - generated_at).total_seconds()
    if age_s < -skew_s:
        return Age(Freshness.FUTURE, age_s)
    if age_s > max_age_s:
        return Age(Freshness.STALE, age_s)
    return Age(Freshness.FRESH, age_s)
