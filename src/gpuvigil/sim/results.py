"""What a run measured, and the table/JSON the CLI prints (filled by the engine).

Definitions (docs/simulator.md "Metrics"):
- node_availability: 1 - node-time unavailable / node-time; a node is unavailable while it
  carries a hardware fault (seen or not) or is out of service for any reason.
- job_success_rate: jobs that finished / jobs that ended (finished or gave up); None when
  no job ended (jobs still running at the end are `jobs_censored`, not successes).
- job_success_by_work: the same weighted by each job's work (GPU-hours it needed): a
  256-node job that gave up weighs 256 one-node jobs.
- goodput: productive GPU-time / allocated GPU-time (work lost to restarts, hangs and slow
  nodes is allocated but not productive; a job that gave up produced nothing).
- mttd_s / mttr_s: fault onset -> detected / -> back in service, over node faults.
- gpu_hours_lost: allocated minus productive GPU-hours.
- false_cordons / false_drains: out-of-service episodes of machines with nothing a repair
  cures (a missing tool, a bad driver image, boot noise), that only blocked new work /
  that drained or repaired it; false_quarantines: such machines handed to a person;
  healthy_replaced: such machines replaced.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Results:
    scenario: str
    nodes: int
    days: float
    seed: int
    workload: str
    node_availability: float = 1.0
    job_success_rate: float | None = None
    job_success_by_work: float | None = None
    goodput: float = 1.0
    job_interruptions: int = 0
    mttd_s: float = 0.0
    mttr_s: float = 0.0
    gpu_hours_lost: float = 0.0
    false_cordons: int = 0
    false_drains: int = 0
    false_quarantines: int = 0
    healthy_replaced: int = 0
    jobs_finished: int = 0
    jobs_failed: int = 0
    jobs_censored: int = 0  # started, not ended when the run stopped
    faults: int = 0
    faults_undetected: int = 0
    remediations: int = 0
    breaker_trips: int = 0
    events: int = 0
    fault_interruptions: int = 0  # distinct faults that interrupted a job (the paper's count)
    fault_interruptions_by_cause: dict[str, int] = field(default_factory=dict)
    # the same, for the kinds the Llama 3 table lists (what calibration compares with 419)
    calibrated_interruptions: int = 0
    calibrated_by_cause: dict[str, int] = field(default_factory=dict)
    interruptions_by_cause: dict[str, int] = field(default_factory=dict)
    interruptions_by_kind: dict[str, int] = field(default_factory=dict)
    attribution: dict[str, int] = field(default_factory=dict)
    slo: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Tally:
    """Running sums the engine adds to; `finish` turns them into Results."""

    def __init__(self) -> None:
        self.detect: list[float] = []
        self.repair: list[float] = []
        self.by_cause: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.by_fault_cause: Counter[str] = Counter()
        self.by_calibrated_cause: Counter[str] = Counter()
        self.productive_s = 0.0  # node-seconds
        self.allocated_s = 0.0
        self.finished = 0
        self.failed = 0
        self.finished_work = 0.0  # GPU-seconds of work of the jobs that finished
        self.failed_work = 0.0  # ... that gave up
        self.censored = 0
        self.false: Counter[str] = Counter()  # cordon | drain | quarantine | replace
        self.remediations = 0
        self.faults = 0

    def fault_interruption(self, *, cause: str, calibrated: bool) -> None:
        self.by_fault_cause[cause] += 1
        if calibrated:
            self.by_calibrated_cause[cause] += 1

    def interruption(self, *, cause: str, kind: str) -> None:
        self.by_cause[cause] += 1
        self.by_kind[kind] += 1

    def finish(self, res: Results, *, unavailable_s: float, gpus_per_node: int) -> Results:
        total = res.nodes * res.days * 86400.0
        res.node_availability = max(0.0, 1.0 - unavailable_s / total) if total else 1.0
        ended = self.finished + self.failed
        res.job_success_rate = self.finished / ended if ended else None
        work = self.finished_work + self.failed_work
        res.job_success_by_work = self.finished_work / work if work else None
        res.jobs_censored = self.censored
        res.goodput = self.productive_s / self.allocated_s if self.allocated_s else 1.0
        res.job_interruptions = sum(self.by_cause.values())
        res.mttd_s = sum(self.detect) / len(self.detect) if self.detect else 0.0
        res.mttr_s = sum(self.repair) / len(self.repair) if self.repair else 0.0
        res.gpu_hours_lost = (self.allocated_s - self.productive_s) * gpus_per_node / 3600.0
        res.false_cordons, res.false_drains = self.false["cordon"], self.false["drain"]
        res.false_quarantines = self.false["quarantine"]
        res.healthy_replaced = self.false["replace"]
        res.jobs_finished, res.jobs_failed = self.finished, self.failed
        res.faults = self.faults
        res.remediations = self.remediations
        res.fault_interruptions = sum(self.by_fault_cause.values())
        res.fault_interruptions_by_cause = dict(sorted(self.by_fault_cause.items()))
        res.calibrated_interruptions = sum(self.by_calibrated_cause.values())
        res.calibrated_by_cause = dict(sorted(self.by_calibrated_cause.items()))
        res.interruptions_by_cause = dict(sorted(self.by_cause.items()))
        res.interruptions_by_kind = dict(sorted(self.by_kind.items()))
        return res


COLUMNS = (
    ("scenario", "scenario", "{}"),
    ("node_availability", "avail.", "{:.3%}"),
    ("job_success_rate", "jobs ok", "{:.2%}"),
    ("goodput", "goodput", "{:.1%}"),
    ("job_interruptions", "restarts", "{:d}"),
    ("mttd_s", "MTTD", "dur"),
    ("mttr_s", "MTTR", "dur"),
    ("gpu_hours_lost", "GPU-h lost", "{:,.0f}"),
    ("false_drains", "false", "{:d}"),
)


def fmt_duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def cells(res: Results) -> list[str]:
    out = []
    for attr, _, f in COLUMNS:
        v = getattr(res, attr)
        out.append("-" if v is None else fmt_duration(v) if f == "dur" else f.format(v))
    return out


def table(results: dict[str, Results], *, title: str = "") -> Any:
    """A rich Table, one row per run, in the order given (the CLI and the demo print it)."""
    from rich.table import Table

    t = Table(title=title or None, caption="false = healthy machines drained (by the run)")
    for i, (_, header, _) in enumerate(COLUMNS):
        t.add_column(header, justify="left" if i == 0 else "right")
    for name, res in results.items():
        t.add_row(name, *cells(res)[1:])
    return t
