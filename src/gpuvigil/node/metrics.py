"""The agent's Prometheus metric families, declared on an explicit registry.

Called by the agent (`gpuvigil.node.agent`) when it composes itself: `build(registry)`
declares every family once; the agent updates the counters as checks finish, and hands
each published report to a `ReportCollector`, which renders the per-check and per-condition
gauges from that report at scrape time (so a label set the latest report lacks simply is not
rendered: nothing to remove by hand, and no scrape can see a half-updated set). Nothing is
registered at import. No `node` label: the scrape target identifies the node, and
`gpuvigil_agent_info` carries the name for joins.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuvigil.core import codes
from gpuvigil.core.findings import CheckRun, Finding, NodeReport, Status

# Checks take from a millisecond (sysfs) to minutes (a DCGM diag).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
STATUS_VALUE = {Status.OK: 0, Status.WARNING: 1, Status.FAILED: 2}


@dataclass(frozen=True)
class AgentMetrics:
    info: Gauge
    report: ReportCollector
    check_last_success: Gauge
    check_duration: Histogram
    check_runs: Counter
    xid_events: Counter
    sxid_events: Counter
    loop_last: Gauge
    kmsg_gaps: Counter
    publish_errors: Counter
    last_publish: Gauge
    remediations: Counter
    rejected_messages: Counter


class ReportCollector(Collector):
    """gpuvigil_check_status, gpuvigil_check_could_not_run and gpuvigil_node_condition,
    rendered from the latest published NodeReport each time the registry is collected.

    Before the first report nothing is rendered (an empty report would read as healthy)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report: NodeReport | None = None

    def set(self, report: NodeReport) -> None:
        with self._lock:
            self._report = report

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(_families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            report = self._report
        status, could_not, condition = _families()
        if report is not None:
            worst, closed = _render(report)
            for (check, component), st in sorted(worst.items()):
                status.add_metric([check, component], STATUS_VALUE[st])
            for check, v in sorted(closed.items()):
                could_not.add_metric([check], v)
            for cond in report.conditions:
                condition.add_metric([cond.type], 1 if cond.status else 0)
        return iter((status, could_not, condition))


def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            "gpuvigil_check_status",
            "Worst status of a check's findings per component: 0 OK, 1 WARNING, 2 FAILED.",
            labels=("check", "component"),
        ),
        GaugeMetricFamily(
            "gpuvigil_check_could_not_run",
            "1 while the check fails closed (timeout, error, missing dependency, stale result).",
            labels=("check",),
        ),
        GaugeMetricFamily(
            "gpuvigil_node_condition",
            "1 when the problem family (node condition) is present.",
            labels=("condition",),
        ),
    )


def _render(report: NodeReport) -> tuple[dict[tuple[str, str], Status], dict[str, int]]:
    """(worst status per (check, component), could-not-run per check) of one report."""
    worst: dict[tuple[str, str], Status] = {}
    could_not: dict[str, int] = {run.check: 0 for run in report.checks}
    for f in report.findings:
        k = (f.check, f.component)
        worst[k] = Status.worst([worst.get(k, Status.OK), f.status])
        if f.could_not_run and f.status is Status.FAILED:
            could_not[f.check] = 1
        else:
            could_not.setdefault(f.check, 0)
    for run in report.checks:  # a check with no findings is OK on the node
        if not any(c == run.check for c, _ in worst):
            worst[(run.check, "node")] = run.status
    return worst, could_not


def build(registry: CollectorRegistry) -> AgentMetrics:
    disable_created_metrics()  # no `<name>_created` series (docs/metrics.md)

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, labels, registry=registry)

    report = ReportCollector()
    registry.register(report)
    return AgentMetrics(
        info=gauge(
            "gpuvigil_agent_info",
            "Always 1; labels name the node and version.",
            ("node", "version"),
        ),
        report=report,
        check_last_success=gauge(
            "gpuvigil_check_last_success_timestamp_seconds",
            "When the check last ran to completion (any verdict but could-not-run), Unix time.",
            ("check",),
        ),
        check_duration=Histogram(
            "gpuvigil_check_duration_seconds",
            "How long one run of a check took.",
            ("check",),
            buckets=DURATION_BUCKETS,
            registry=registry,
        ),
        check_runs=counter(
            "gpuvigil_check_runs_total",
            "Check runs by result: ok, warning, failed, timeout, error.",
            ("check", "result"),
        ),
        xid_events=counter(
            "gpuvigil_xid_events_total", "Xid events seen in the kernel log.", ("code", "gpu")
        ),
        sxid_events=counter(
            "gpuvigil_sxid_events_total",
            "NVSwitch SXid events seen in the kernel log.",
            ("code", "component"),
        ),
        loop_last=gauge(
            "gpuvigil_agent_loop_last_timestamp_seconds",
            "Heartbeat of the agent's loop, Unix time; the self-watchdog exits when it stalls.",
        ),
        kmsg_gaps=counter(
            "gpuvigil_kmsg_gaps_total",
            "Kernel log records lost to ring-buffer overruns (or gaps in the sequence).",
        ),
        publish_errors=counter(
            "gpuvigil_agent_publish_errors_total", "Failed publish attempts per sink.", ("sink",)
        ),
        last_publish=gauge(
            "gpuvigil_agent_last_publish_timestamp_seconds",
            "When a sink last published successfully, Unix time.",
            ("sink",),
        ),
        remediations=counter(
            "gpuvigil_agent_remediations_total",
            "Remediation requests the agent executed, by action and result.",
            ("action", "result"),
        ),
        rejected_messages=counter(
            "gpuvigil_agent_rejected_messages_total",
            "Messages on this node the agent ignored: not signed by the controller, too old, "
            "unreadable (docs/security.md).",
            ("kind", "reason"),
        ),
    )


RUN_RESULTS = ("ok", "warning", "failed", "timeout", "error")
AGENT_REMEDIATION_RESULTS = ("succeeded", "failed")


def zero_known(
    m: AgentMetrics, *, checks: list[str], sinks: list[str], actions: tuple[str, ...]
) -> None:
    """Create every counter at 0 for the label sets known at start-up, so the first run,
    error or remediation is an increase from 0 that increase()/rate() count (a series
    born at 1 reads as "no change"). Xid/SXid series (code, GPU) are not knowable ahead:
    the dashboard counts their first event with `or (x unless x offset R)`."""
    for check in checks:
        for result in RUN_RESULTS:
            m.check_runs.labels(check, result)
    for sink in sinks:
        m.publish_errors.labels(sink)
    for action in actions:
        for result in AGENT_REMEDIATION_RESULTS:
            m.remediations.labels(action, result)


def run_result(findings: list[Finding], run: CheckRun) -> str:
    """The `result` label of one run: timeout and error are told apart from verdicts."""
    codes_seen = {f.code for f in findings if f.status is Status.FAILED}
    if "CHECK_TIMEOUT" in codes_seen:
        return "timeout"
    if codes_seen & codes.COULD_NOT_RUN:
        return "error"
    return run.status.value.lower()


def observe_run(m: AgentMetrics, findings: list[Finding], run: CheckRun, *, now_s: float) -> None:
    """Called by the scheduler's completion hook, once per finished run."""
    result = run_result(findings, run)
    m.check_runs.labels(run.check, result).inc()
    m.check_duration.labels(run.check).observe(run.duration_s)
    if result not in ("timeout", "error"):
        m.check_last_success.labels(run.check).set(now_s)


def observe_report(m: AgentMetrics, report: NodeReport) -> None:
    """The next scrape renders the per-check and per-condition gauges from this report."""
    m.report.set(report)
