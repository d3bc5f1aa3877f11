"""What a run measured, and the table the CLI prints (filled by the engine).

Every number is a field declared with `observe.figures.figure` (its label, unit and
definition, docs/simulator.md "Metrics"); the terminal table, `--json` and the demo's
HTML report all read the figures from here, so they show the same numbers with the same
names. These are the simulator's ground truth: it knows when each fault began and ended.
`slo` holds what layer 4 computed from the run's own events (`observe.summary`), which
only sees what was reported; views that show it say so.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuvigil.observe.figures import (
    COUNT,
    GPU_HOURS,
    NUMBER,
    RATIO,
    SECONDS,
    SETTING,
    TABLES,
    Figure,
    figure,
    figures_of,
)


@dataclass
class Results:
    scenario: str
    nodes: int = field(metadata=SETTING)
    days: float = field(metadata=SETTING)
    seed: int = field(metadata=SETTING)
    workload: str
    node_availability: float = figure(
        1.0, "availability", RATIO, "1 - node-time unavailable / node-time; a node is "
        "unavailable while it carries a hardware fault (seen or not) or is out of service",
        table=1, digits=3,
    )  # fmt: skip
    # None when no job ended: jobs still running at the end are censored, not successes.
    job_success_rate: float | None = figure(
        None, "job success", RATIO, "jobs that finished / jobs that ended (finished or gave "
        "up); none when no job ended", table=1, digits=2,
    )  # fmt: skip
    job_success_by_work: float | None = figure(
        None, "job success by work", RATIO, "the same weighted by each job's work (the "
        "GPU-hours it needed): a 256-node job that gave up weighs 256 one-node jobs",
        table=1, digits=2,
    )  # fmt: skip
    goodput: float = figure(
        1.0, "goodput", RATIO, "productive GPU-time / allocated GPU-time; work lost to "
        "restarts, hangs and slow nodes, and all the work of a job that gave up, is lost",
        table=1,
    )  # fmt: skip
    ettr: float = figure(
        1.0, "ETTR", RATIO, "effective training time ratio: productive node-time / (job size x "
        "wall time from the job's first start to its end, or to the horizon); restarts, "
        "recomputation and time waiting for nodes all count against it", table=1,
    )  # fmt: skip
    job_interruptions: int = figure(
        0, "restarts", COUNT, "job restarts for any reason, drains included", table=1
    )
    mttd_s: float = figure(
        0.0, "MTTD", SECONDS, "mean time from a hardware fault's onset to its detection",
        table=1,
    )  # fmt: skip
    mttr_s: float = figure(
        0.0, "MTTR", SECONDS, "mean time from a hardware fault's onset to the node back in "
        "service", table=1,
    )  # fmt: skip
    gpu_hours_lost: float = figure(
        0.0, "GPU-h lost", GPU_HOURS, "allocated minus productive GPU-hours", table=1
    )
    # Out-of-service episodes of machines with nothing a repair cures (a missing tool, a bad
    # driver image, boot noise), by how far they went. A person's release is not one.
    false_cordons: int = figure(
        0, "false cordons", COUNT, "healthy machines only blocked from new work", table=2
    )
    false_drains: int = figure(
        0, "false drains", COUNT, "healthy machines drained or remediated (cordons not "
        "counted)", table=1,
    )  # fmt: skip
    false_quarantines: int = figure(
        0, "false quarantines", COUNT, "healthy machines handed to a person", table=2
    )
    healthy_replaced: int = figure(
        0, "healthy replaced", COUNT, "healthy machines replaced", table=2
    )
    # Exposure (ground truth): what the breaker, budgets and memory of machines let through.
    broken_in_service_h: float = figure(
        0.0, "broken in service (node-h)", NUMBER, "node-hours a node with a fault that "
        "affects work (seen or not) was schedulable", table=2,
    )  # fmt: skip
    max_quarantines_per_machine: int = figure(
        0, "most quarantines", COUNT, "the most times one machine (a replacement is a new "
        "one) was quarantined", table=2,
    )  # fmt: skip
    lemons_replaced: int = figure(
        0, "lemons replaced", COUNT, "machines whose fault returns after every repair that "
        "were replaced", table=2,
    )  # fmt: skip
    # --json only: 0 unless SimConfig.replacement_faulty_rate is set, and a 16th column of
    # "what each run did" overflowed the demo's HTML at 1280 px
    faulty_replacements: int = figure(
        0, "faulty replacements", COUNT, "replacement machines that arrived with a hardware "
        "fault (SimConfig.replacement_faulty_rate)",
    )  # fmt: skip
    max_flaps_in_service: int = figure(
        0, "most flaps", COUNT, "the most times one machine went back into service and the "
        "same fault returned", table=2,
    )  # fmt: skip
    # Serving and per-GPU isolation (issue #23, sim.serving)
    gpu_hours_kept_by_isolation: float = figure(
        0.0, "GPU-h kept by isolation", GPU_HOURS, "GPU-hours the healthy GPUs of a machine "
        "with one GPU isolated spent serving, while the whole-node ladder would have had the "
        "machine out", table=2,
    )  # fmt: skip
    serving_minutes_below_demand: float = figure(
        0.0, "serving min below demand", NUMBER, "minutes during which fewer serving "
        "replicas were Ready than the demand (the HPA's desired replicas) asked for",
        table=2, digits=1,
    )  # fmt: skip
    jobs_finished: int = figure(0, "jobs finished", COUNT)
    jobs_failed: int = figure(0, "jobs failed", COUNT, "jobs that gave up")
    jobs_censored: int = figure(
        0, "jobs censored", COUNT, "jobs started and still running when the run stopped"
    )
    faults: int = figure(0, "faults", COUNT, "faults that struck a node in service", table=2)
    faults_undetected: int = figure(
        0, "faults undetected", COUNT, "hardware faults still unseen when the run ended"
    )
    remediations: int = figure(0, "remediations", COUNT, "remediation steps started", table=2)
    breaker_trips: int = figure(
        0, "breaker trips", COUNT, "times a breaker signature opened", table=2
    )
    events: int = figure(0, "simulator events", COUNT, "events the engine processed")
    # distinct faults that interrupted a job (the paper's count)
    fault_interruptions: int = figure(
        0, "interrupting faults", COUNT, "distinct faults that interrupted a job", table=2
    )
    fault_interruptions_by_cause: dict[str, int] = field(default_factory=dict)
    # the same, for the kinds the Llama 3 table lists (what calibration compares with 419)
    calibrated_interruptions: int = figure(
        0, "calibrated interruptions", COUNT, "interrupting faults of the kinds the Llama 3 "
        "paper's table lists (its 419)",
    )  # fmt: skip
    calibrated_by_cause: dict[str, int] = field(default_factory=dict)
    interruptions_by_cause: dict[str, int] = field(default_factory=dict)
    interruptions_by_kind: dict[str, int] = field(default_factory=dict)
    attribution: dict[str, int] = field(default_factory=dict)
    slo: dict[str, Any] = field(default_factory=dict)  # layer 4's logged figures, by key
    # what `split-brain` / `api-outage` saw (sim.adversity): writes by a non-holder, budget
    # overruns, fenced writes, leader changes; refused calls and failed passes
    adversity: dict[str, Any] = field(default_factory=dict)
    wall_s: float = figure(0.0, "wall time", SECONDS, "how long the run took to simulate")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def figures(self) -> list[Figure]:
        """Every figure of the run (ground truth), in declaration order."""
        return figures_of(self)


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
        self.wall_s = 0.0  # node-seconds from each job's first start to its end or the horizon
        self.finished = 0
        self.failed = 0
        self.finished_work = 0.0  # GPU-seconds of work of the jobs that finished
        self.failed_work = 0.0  # ... that gave up
        self.censored = 0
        self.false: Counter[str] = Counter()  # cordon | drain | quarantine | replace
        self.remediations = 0
        self.faults = 0
        self.broken_in_service_s = 0.0
        self.max_quarantines = 0
        self.lemons_replaced = 0
        self.faulty_replacements = 0
        self.max_flaps = 0
        self.serving_below_min = 0.0
        self.kept_gpu_s = 0.0  # GPU-seconds served on machines with one GPU isolated

    def fault_interruption(self, *, cause: str, calibrated: bool) -> None:
        self.by_fault_cause[cause] += 1
        if calibrated:
            self.by_calibrated_cause[cause] += 1

    def wall(self, job: Any, t: float) -> None:
        """A job ended (or the run did): its size x wall time since its first start."""
        if job.started_s is not None:
            self.wall_s += job.size * max(0.0, t - job.started_s)

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
        res.ettr = min(1.0, self.productive_s / self.wall_s) if self.wall_s else 1.0
        res.job_interruptions = sum(self.by_cause.values())
        res.mttd_s = sum(self.detect) / len(self.detect) if self.detect else 0.0
        res.mttr_s = sum(self.repair) / len(self.repair) if self.repair else 0.0
        res.gpu_hours_lost = (self.allocated_s - self.productive_s) * gpus_per_node / 3600.0
        res.false_cordons, res.false_drains = self.false["cordon"], self.false["drain"]
        res.false_quarantines = self.false["quarantine"]
        res.healthy_replaced = self.false["replace"]
        res.broken_in_service_h = self.broken_in_service_s / 3600.0
        res.max_quarantines_per_machine = self.max_quarantines
        res.lemons_replaced = self.lemons_replaced
        res.faulty_replacements = self.faulty_replacements
        res.max_flaps_in_service = self.max_flaps
        res.serving_minutes_below_demand = self.serving_below_min
        res.gpu_hours_kept_by_isolation = self.kept_gpu_s / 3600.0
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


def table(results: dict[str, Results], *, width: int, title: str = "", which: int = 1) -> Any:
    """The runs side by side, one row each, in the order given: the figures declared for
    table `which`, laid out to `width` without cutting a name or a number."""
    from gpuvigil.observe import terminal

    figs = {name: [f for f in r.figures() if f.spec.table == which] for name, r in results.items()}
    first = next(iter(figs.values()), [])
    columns = [terminal.Column("run", key=True)]
    columns += [terminal.Column(f.label, justify="right", wrap=False) for f in first]
    rows = [[terminal.plain(name)] + [f.text for f in fs] for name, fs in figs.items()]
    legend = "; ".join(f"{f.label}: {f.spec.about}" for f in first if f.key == "false_drains")
    return terminal.render(columns, rows, width=width, title=title or TABLES[which] or None,
                           caption=legend or None)  # fmt: skip
