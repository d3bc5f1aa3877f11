"""One streaming pass over the event log: SLOs, attribution and offender counts together.

Called by `gpuvigil report` and the simulator. `summarize()` feeds every event to an
`SloTracker` and an `Attributor` and counts FAILED findings per code and per GPU (for the
"top offenders" tables); `Summary.to_json()` is the stable `--json` format documented in
docs/observability.md (`"format": "gpuvigil.report/v1"`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuvigil.core.events import Event, Kind
from gpuvigil.observe.attribution import Attributor
from gpuvigil.observe.events import ReadStats
from gpuvigil.observe.figures import COUNT, LOGGED, RATIO, SECONDS, Figure, Spec, figures_of
from gpuvigil.observe.slo import SloConfig, SloReport, SloTracker, Targets

FORMAT = "gpuvigil.report/v1"
TOP = 10
# A GPU is `gpu:<index>`, or `pci:<bus id>` when the agent could not map the bus id to an
# index (NVML down): both name one physical GPU.
GPU_COMPONENTS = ("gpu:", "pci:")

# The report's headline figures (docs/observability.md "SLO definitions"). Where the
# simulator counts the same thing from its ground truth, the key, label and unit are the
# simulator's (`sim.results.Results`): a test holds the two in step.
HEADLINE = {
    "node_availability": Spec(
        "availability",
        RATIO,
        "in-service node-time / node-time outside planned maintenance, from node.state events",
        LOGGED,
        digits=3,
    ),
    "job_success_rate": Spec(
        "job success",
        RATIO,
        "succeeded / (succeeded + failed) jobs, from job.end events",
        LOGGED,
        digits=2,
    ),
    "job_success_by_work": Spec(
        "job success by work",
        RATIO,
        "the same weighted by each job's GPU-time, from job.end events",
        LOGGED,
        digits=2,
    ),
    "goodput": Spec(
        "goodput", RATIO, "productive / allocated GPU-time, from job.end events", LOGGED
    ),
    "ettr": Spec(
        "ETTR",
        RATIO,
        "productive step time / each job's size x wall time from its start to its end (or "
        "the window's close), from job.start, job.restart (lost_s) and job.end events",
        LOGGED,
    ),
    "job_interruptions": Spec("restarts", COUNT, "job.restart events", LOGGED),
    "mttd_s": Spec(
        "MTTD",
        SECONDS,
        "mean time from a node's fault event (or a finding's first "
        "evidence) to its first FAILED finding: only faults some check reported",
        LOGGED,
    ),
    "mttr_s": Spec(
        "MTTR",
        SECONDS,
        "mean time from a node's first FAILED finding (or its leaving "
        "service) to its return to service",
        LOGGED,
    ),
}
# Labels for the SloReport counters shown after the headline (others flow as named).
DETAIL = {
    "drains": Spec("drains", COUNT, "times a node left service and reached a drain state",
                   LOGGED),
    "false_positive_drains": Spec(
        "false-positive drains", COUNT, "drains that ended without a repair (no reset, "
        "reboot, replacement or maintenance)", LOGGED),
    "cordons": Spec("cordons", COUNT, "times a node left service without a drain", LOGGED),
    "incidents_absorbed": Spec(
        "incidents absorbed", COUNT, "problems set and cleared without leaving service",
        LOGGED),
    "breaker_trips": Spec("breaker trips", COUNT, "times the circuit breaker opened", LOGGED),
    "jobs_censored": Spec("jobs censored", COUNT, "jobs started and not ended by the window's "
                          "close: no verdict", LOGGED),
    "human_releases": Spec("human releases", COUNT, "drains a person ended (gpuvigil "
                           "release): never false positives", LOGGED),
}  # fmt: skip
# SloReport fields that are inputs of the figures above, not figures themselves.
INPUTS = frozenset({"start", "end", "node_seconds", "in_service_seconds", "maintenance_seconds",
                    "productive_gpu_s", "allocated_gpu_s", "succeeded_gpu_s",
                    "ettr_productive_gpu_s", "ettr_wall_gpu_s",
                    "failed_gpu_s", "jobs_succeeded", "jobs_failed",
                    "jobs_cancelled", "job_restarts"})  # fmt: skip


@dataclass
class Summary:
    slo: SloReport
    attribution: Attributor
    stats: ReadStats = field(default_factory=ReadStats)
    findings_by_code: Counter[str] = field(default_factory=Counter)
    findings_by_gpu: Counter[tuple[str, str]] = field(default_factory=Counter)
    events_by_kind: Counter[str] = field(default_factory=Counter)

    def figures(self) -> list[Figure]:
        """Every figure of the report (measure LOGGED): the headline, then the counters."""
        r = self.slo
        values = {
            "node_availability": r.availability,
            "job_success_rate": r.job_success_rate,
            "job_success_by_work": r.job_success_by_work,
            "goodput": r.goodput,
            "ettr": r.ettr,
            "job_interruptions": r.job_restarts,
            "mttd_s": r.mttd.mean,
            "mttr_s": r.mttr.mean,
        }
        out = [Figure(k, spec, values[k]) for k, spec in HEADLINE.items()]
        for f in figures_of(r, measure=LOGGED):
            if f.key not in INPUTS:
                out.append(Figure(f.key, DETAIL.get(f.key, f.spec), f.value))
        return out

    def top_nodes(self, n: int = TOP) -> list[dict[str, Any]]:
        """Nodes by downtime (then hardware-attributed job failures)."""
        down = self.slo.node_downtime_s
        names = set(down) | set(self.attribution.by_node)
        rows = [
            {
                "node": name,
                "downtime_s": round(down.get(name, 0.0), 3),
                "job_failures": self.attribution.by_node.get(name, 0),
            }
            for name in names
        ]
        rows.sort(key=lambda r: (-r["downtime_s"], -r["job_failures"], r["node"]))
        return rows[:n]

    def node_count(self) -> int:
        """Nodes with downtime or a hardware-attributed failure (what top_nodes ranks)."""
        return len(set(self.slo.node_downtime_s) | set(self.attribution.by_node))

    def top_gpus(self, n: int = TOP) -> list[dict[str, Any]]:
        rows = [
            {"node": node, "gpu": comp, "findings": count}
            for (node, comp), count in self.findings_by_gpu.most_common()
        ]
        rows.sort(key=lambda r: (-r["findings"], r["node"], r["gpu"]))
        return rows[:n]

    def to_json(self) -> dict[str, Any]:
        tl = self.slo.timeline
        return {
            "format": FORMAT,
            "input": self.stats.to_json(),
            "slo": self.slo.to_json(),
            "attribution": self.attribution.to_json(),
            "top_nodes": self.top_nodes(),
            "top_gpus": self.top_gpus(),
            "findings_by_code": dict(self.findings_by_code.most_common(20)),
            "events_by_kind": dict(sorted(self.events_by_kind.items())),
            "availability_series": tl.series() if tl is not None else [],
            # every figure under its one name, label and unit (as the tables and HTML show it)
            "figures": {
                f.key: {"label": f.label, "unit": f.spec.unit, "value": f.value}
                for f in self.figures()
            },
        }


def summarize(
    events: Iterable[Event],
    *,
    start: float | None = None,
    end: float | None = None,
    targets: Targets | None = None,
    config: SloConfig | None = None,
    stats: ReadStats | None = None,
    lookback_s: float = 600.0,
    grace_s: float = 120.0,
) -> Summary:
    """One pass over a time-ordered event stream; memory bounded (see each tracker)."""
    slo = SloTracker(start=start, end=end, targets=targets, config=config)
    attr = Attributor(start=start, end=end, lookback_s=lookback_s, grace_s=grace_s)
    by_code: Counter[str] = Counter()
    by_gpu: Counter[tuple[str, str]] = Counter()
    kinds: Counter[str] = Counter()
    finding_set = Kind.FINDING_SET.value
    for ev in events:
        slo.feed(ev)
        attr.feed(ev)
        kinds[ev.kind] += 1
        if ev.kind == finding_set and ev.node is not None and _in(ev.ts, start, end):
            d = ev.data
            if str(d.get("status", "FAILED")) == "FAILED":
                by_code[str(d.get("code", "?"))] += 1
                comp = str(d.get("component", ""))
                if comp.startswith(GPU_COMPONENTS):
                    by_gpu[(ev.node, comp)] += 1
    report = slo.finish()
    attr.start = report.start
    return Summary(
        slo=report,
        attribution=attr.finish(),
        stats=stats if stats is not None else ReadStats(),
        findings_by_code=by_code,
        findings_by_gpu=by_gpu,
        events_by_kind=kinds,
    )


def _in(ts: float, start: float | None, end: float | None) -> bool:
    return (start is None or ts >= start) and (end is None or ts <= end)
