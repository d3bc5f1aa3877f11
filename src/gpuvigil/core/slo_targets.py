"""The SLO targets and burn-rate windows: the one definition.

`gpuvigil report` (observe.slo_report, commands.report) takes its defaults from here;
deploy/prometheus/rules.yaml and deploy/grafana/gpuvigil.json carry the same numbers as
PromQL literals (Prometheus cannot import Python), and tests/unit/observe/test_slo_targets.py
fails when any of them disagrees with this module.
"""

from __future__ import annotations

AVAILABILITY = 0.9995  # node availability over 30 days
JOB_SUCCESS = 0.995  # jobs that end, succeeded over succeeded + failed, over 30 days
WINDOW_DAYS = 30

# The Google SRE workbook's multi-window, multi-burn-rate alerts for a 30-day SLO:
# (burn-rate factor, long window, short window, severity).
BURN_WINDOWS = (
    (14.4, "1h", "5m", "page"),
    (6.0, "6h", "30m", "page"),
    (3.0, "1d", "2h", "ticket"),
    (1.0, "3d", "6h", "ticket"),
)


def error_budget(target: float) -> float:
    """The allowed error ratio of a target, rounded so 1 - 0.9995 reads 0.0005."""
    return round(1.0 - target, 10)
