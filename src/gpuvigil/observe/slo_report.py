"""The SLO report's figures and their JSON form (`gpuvigil report --json`, `slo` key).

Filled in by `observe.slo.SloTracker`; read by the report's tables, HTML and JSON. The
definitions of each figure are in docs/observability.md ("SLO definitions").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuvigil.core import slo_targets
from gpuvigil.observe.stats import Distribution, budget_burn, ratio
from gpuvigil.observe.timeline import Timeline


@dataclass(frozen=True)
class Targets:
    """SLO targets over the report window (defaults: 99.95% availability, 99.5% jobs)."""

    availability: float = slo_targets.AVAILABILITY
    job_success: float = slo_targets.JOB_SUCCESS


@dataclass
class SloReport:
    start: float | None
    end: float | None
    targets: Targets
    node_seconds: float = 0.0
    in_service_seconds: float = 0.0
    maintenance_seconds: float = 0.0
    jobs_succeeded: int = 0
    jobs_failed: int = 0
    jobs_cancelled: int = 0
    jobs_censored: int = 0  # started in the window and not ended by its close: no verdict
    succeeded_gpu_s: float = 0.0  # GPU-time of the jobs that succeeded / that failed
    failed_gpu_s: float = 0.0
    job_restarts: int = 0
    productive_gpu_s: float = 0.0
    allocated_gpu_s: float = 0.0
    # ETTR: productive GPU-time over each job's size x wall time from its start to its end
    # (or to the window's close): restarts and time spent off the cluster count against it.
    ettr_productive_gpu_s: float = 0.0
    ettr_wall_gpu_s: float = 0.0
    mttd: Distribution = field(default_factory=Distribution)
    mttr: Distribution = field(default_factory=Distribution)
    drains: int = 0
    cordons: int = 0  # out of service without a drain (new work blocked), then back
    false_positive_drains: int = 0
    human_releases: int = 0  # drains a person ended (`gpuvigil release`): never false positives
    incidents_absorbed: int = 0  # conditions set and cleared without leaving service
    breaker_trips: int = 0
    node_downtime_s: dict[str, float] = field(default_factory=dict)
    timeline: Timeline | None = None

    @property
    def availability(self) -> float | None:
        return ratio(self.in_service_seconds, self.node_seconds - self.maintenance_seconds)

    @property
    def job_success_rate(self) -> float | None:
        return ratio(self.jobs_succeeded, self.jobs_succeeded + self.jobs_failed)

    @property
    def job_success_by_work(self) -> float | None:
        """Job success weighted by GPU-time: a 256-node job that gave up weighs its size."""
        return ratio(self.succeeded_gpu_s, self.succeeded_gpu_s + self.failed_gpu_s)

    @property
    def goodput(self) -> float | None:
        return ratio(self.productive_gpu_s, self.allocated_gpu_s)

    @property
    def ettr(self) -> float | None:
        """Effective training time ratio: productive step time over wall time."""
        return ratio(self.ettr_productive_gpu_s, self.ettr_wall_gpu_s)

    def to_json(self) -> dict[str, Any]:
        def slo(achieved: float | None, target: float) -> dict[str, Any]:
            burn = budget_burn(achieved, target)
            return {
                "achieved": None if achieved is None else round(achieved, 6),
                "target": target,
                "met": None if achieved is None else achieved >= target,
                "budget_burned": None if burn is None else round(burn, 4),
            }

        return {
            "window": {"start": self.start, "end": self.end},
            "availability": {
                **slo(self.availability, self.targets.availability),
                "node_seconds": round(self.node_seconds, 3),
                "in_service_seconds": round(self.in_service_seconds, 3),
                "maintenance_seconds": round(self.maintenance_seconds, 3),
            },
            "job_success": {
                **slo(self.job_success_rate, self.targets.job_success),
                "succeeded": self.jobs_succeeded,
                "failed": self.jobs_failed,
                "cancelled": self.jobs_cancelled,
                "censored": self.jobs_censored,
                "by_work": None
                if self.job_success_by_work is None
                else round(self.job_success_by_work, 6),
                "restarts": self.job_restarts,
            },
            "goodput": {
                "ratio": None if self.goodput is None else round(self.goodput, 6),
                "productive_gpu_s": round(self.productive_gpu_s, 3),
                "allocated_gpu_s": round(self.allocated_gpu_s, 3),
            },
            "ettr": {
                "ratio": None if self.ettr is None else round(self.ettr, 6),
                "productive_gpu_s": round(self.ettr_productive_gpu_s, 3),
                "wall_gpu_s": round(self.ettr_wall_gpu_s, 3),
            },
            "mttd": self.mttd.to_json(),
            "mttr": self.mttr.to_json(),
            "drains": {
                "total": self.drains,
                "false_positive": self.false_positive_drains,
                "human_releases": self.human_releases,
                "cordons": self.cordons,
                "absorbed_incidents": self.incidents_absorbed,
            },
            "breaker_trips": self.breaker_trips,
        }
