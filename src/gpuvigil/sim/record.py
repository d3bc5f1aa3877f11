"""Layer 4 inside the simulator: the events a run writes (called by the engine).

`Recorder` is the no-op base (fast runs, the bench); `EventRecorder` builds the real
`gpuvigil.core.events.Event` envelopes, writes them if asked, and feeds layer 4's SLO
tracker and failure attribution as the run goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuvigil.core.events import Event, EventWriter, Kind, cause_fields
from gpuvigil.observe.figures import LOGGED, MEASURES
from gpuvigil.training import lifecycle

if TYPE_CHECKING:
    from gpuvigil.core.findings import Finding
    from gpuvigil.sim.jobs import Job
    from gpuvigil.sim.results import Results

# Simulated time 0 is this instant (the in-memory cluster's epoch too).
T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


class Recorder:
    """Does nothing: the engine calls these hooks at each transition."""

    def fault(self, t: float, node: str, fault: str, component: str) -> None: ...
    def fleet(self, t: float, names: Iterable[str]) -> None: ...
    def findings(
        self, t: float, node: str, findings: Iterable[Finding], *, cleared: bool = False
    ) -> None: ...
    def state(
        self, t: float, node: str, to: str, reason: str, found: Iterable[Finding] = ()
    ) -> None: ...
    def held(self, t: float, node: str, why: str) -> None: ...
    def remediation(
        self, t: float, node: str, action: str, *, result: str = "started", reason: str = ""
    ) -> None: ...
    def submit(self, t: float, job: Job) -> None: ...
    def job_start(self, t: float, job: Job) -> None: ...
    def job_restart(
        self,
        t: float,
        job: Job,
        *,
        reason: str,
        lost_s: float,
        node: str | None = None,
        exit_code: int | None = None,
    ) -> None: ...
    def hang(self, t: float, job: Job, *, node: str, timeout_s: float) -> None: ...
    def job_end(
        self, t: float, job: Job, *, ok: bool, productive_s: float, exit_code: int | None = 0
    ) -> None: ...
    def finish(self, t: float, res: Results) -> None: ...

    def summary(self) -> dict[str, Any]:
        return {}


class EventRecorder(Recorder):
    """Real `core.events.Event`s for every transition, kept in order for layer 4.

    `finish` runs `observe.summary.summarize` (SLO tracker + failure attribution) over
    them and stores what layer 4 would report in the run's results; `summary` keeps the
    whole `observe.summary.Summary` for the HTML report. The controller writes its own
    node.state/remediation/breaker events here too (it takes any object with `write`).
    """

    def __init__(self, *, write_to: Path | None = None, sim_states: bool = True) -> None:
        self.events: list[Event] = []
        self.sim_states = sim_states  # False when the real controller reports states
        if write_to is not None:
            write_to.unlink(missing_ok=True)  # one run per file: EventWriter appends
        self._writer = EventWriter(write_to) if write_to is not None else None
        self.report: Any = None

    def write(self, event: Event) -> None:  # the controller's EventWriter interface
        self.events.append(event)
        if self._writer is not None:
            self._writer.write(event)

    def _emit(self, t: float, kind: Kind, /, *, node: str | None = None, job: str | None = None,
              source: str = "sim", **data: Any) -> None:  # fmt: skip
        self.write(Event(ts=T0 + t, kind=kind.value, source=source, node=node, job=job,
                         data=data))  # fmt: skip

    def fleet(self, t: float, names: Iterable[str]) -> None:
        """Every node in service at the start, so layer 4 counts the whole fleet."""
        for name in names:
            self._emit(t, Kind.NODE_STATE, node=name, to="HEALTHY", reason="in the fleet")

    def fault(self, t: float, node: str, fault: str, component: str) -> None:
        self._emit(t, Kind.FAULT, node=node, fault=fault, component=component)

    def findings(
        self, t: float, node: str, findings: Iterable[Finding], *, cleared: bool = False
    ) -> None:
        kind = Kind.FINDING_CLEARED if cleared else Kind.FINDING_SET
        for f in findings:
            self._emit(t, kind, node=node, source="agent", code=f.code,
                       component=f.component, status=f.status.value, action=f.action.value,
                       fatal=f.fatal, check=f.check, message=f.message)  # fmt: skip

    def state(
        self, t: float, node: str, to: str, reason: str, found: Iterable[Finding] = ()
    ) -> None:
        """`found`: the findings behind the move, published as the controller does
        (`codes`, `components`: what layer 4 reads; `reason` is for people)."""
        if self.sim_states:
            self._emit(t, Kind.NODE_STATE, node=node, to=to, reason=reason,
                       **cause_fields(found))  # fmt: skip

    def remediation(self, t: float, node: str, action: str, *, result: str = "started",
                    reason: str = "") -> None:  # fmt: skip
        if self.sim_states:
            self._emit(t, Kind.REMEDIATION, node=node, action=action, result=result,
                       reason=reason)  # fmt: skip

    def job_start(self, t: float, job: Job) -> None:
        self._emit(t, Kind.JOB_START, job=f"job-{job.id}", source="training",
                   nodes=[f"node-{n:05d}" for n in job.nodes], gpus=job.gpus)  # fmt: skip

    def job_restart(self, t: float, job: Job, *, reason: str, lost_s: float,
                    node: str | None = None, exit_code: int | None = None) -> None:  # fmt: skip
        extra: dict[str, Any] = ({"node": node} if node else {}) | (
            {"exit_code": exit_code} if exit_code is not None else {})  # fmt: skip
        # As training's job.restart says it (`training.lifecycle`): a worker killed with no
        # code of its own is one the monitor found dead.
        kind = "dead" if exit_code is None else lifecycle.kind_of_exit(exit_code)
        extra |= {"cause": lifecycle.cause_of(kind).value, "kind": kind}
        self._emit(t, Kind.JOB_RESTART, job=f"job-{job.id}", source="training", reason=reason,
                   lost_s=lost_s, **extra)  # fmt: skip

    def hang(self, t: float, job: Job, *, node: str, timeout_s: float) -> None:
        """What layer 3's watchdog writes when it ends a hung step (`training.watchdog`)."""
        self._emit(t, Kind.HANG, node=node, job=f"job-{job.id}", source="training", rank=0,
                   step=None, waited_s=timeout_s, timeout_s=timeout_s, where="collective",
                   in_collective=True, reason="timeout")  # fmt: skip

    def job_end(self, t: float, job: Job, *, ok: bool, productive_s: float,
                exit_code: int | None = 0) -> None:  # fmt: skip
        allocated = (job.allocated_s / max(job.size, 1)) * job.gpus
        code: dict[str, Any] = {"exit_code": exit_code} if exit_code is not None else {}
        if not ok and exit_code is not None:  # the launcher's failed job.end says who
            code["cause"] = lifecycle.cause_of(lifecycle.kind_of_exit(exit_code)).value
        self._emit(t, Kind.JOB_END, job=f"job-{job.id}", source="training",
                   result="succeeded" if ok else "failed", **code,
                   productive_gpu_s=productive_s * job.gpus, allocated_gpu_s=allocated)  # fmt: skip

    def finish(self, t: float, res: Results) -> None:
        from gpuvigil.observe.events import ReadStats
        from gpuvigil.observe.summary import summarize

        if self._writer is not None:
            self._writer.close()
        n = len(self.events)
        stats = ReadStats(lines=n, events=n, sources=[f"gpuvigil simulate ({res.scenario})"])
        self.report = summarize(self.events, start=T0, end=T0 + t, stats=stats)
        # Layer 4's figures of this run, under the simulator's names for the same things;
        # `measure` says in the JSON itself that these are logged, not ground truth.
        res.slo = {f.key: f.value for f in self.report.figures()}
        res.slo |= {"events": len(self.events), "measure": MEASURES[LOGGED]}
        res.attribution = dict(self.report.attribution.by_cause)

    def summary(self) -> dict[str, Any]:
        return self.report.to_json() if self.report is not None else {}
