"""SLOs from the event log: node availability, job success, goodput, MTTD, MTTR,
false-positive drains and error-budget burn. Pure and streaming.

Called by `gpuvigil report` (through `observe.summary`) and by the simulator's report.
Feed events in time order with `SloTracker.feed`, then call `finish()`; memory grows with
the number of nodes, running jobs and time buckets, never with the number of events.
The definitions are in docs/observability.md ("SLO definitions"); the comments here say
how each maps to events.

Public API (stable, used by the simulator): `Targets`, `SloConfig`, `SloTracker`,
`SloReport`, `compute(events, start=, end=, targets=, config=)`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuvigil.core import exit_codes
from gpuvigil.core.events import Event, Kind
from gpuvigil.core.states import REMOVED, State
from gpuvigil.observe.slo_report import SloReport, Targets
from gpuvigil.observe.timeline import Timeline

__all__ = ["SloConfig", "SloReport", "SloTracker", "Targets", "compute"]


@dataclass(frozen=True)
class SloConfig:
    """How node states map to availability. The defaults are the controller's states
    (`core.states`); planned maintenance comes from `node.maintenance` events, and a
    site whose own tooling writes `node.state` events names its states here."""

    in_service_states: frozenset[str] = frozenset(s.value for s in State if s.in_service)
    maintenance_states: frozenset[str] = frozenset()
    removed_states: frozenset[str] = frozenset({REMOVED})
    # States that mean running work was (being) moved off: an episode that reaches one is a
    # drain; one that only blocked new work (SUSPECT) is a cordon.
    drain_states: frozenset[str] = frozenset(s.value for s in State if s.takes_work_away)
    # Remediations that repair a node (a drain ended by one of these is not a false positive).
    repair_actions: frozenset[str] = frozenset({"RESET_GPU", "REBOOT", "REPLACE"})
    # States only a person ends (`gpuvigil release`): an episode that reached one ended on a
    # person's verdict (a repair, or nothing found), never counted as a false positive.
    human_states: frozenset[str] = frozenset({"QUARANTINED"})
    max_open_jobs: int = 100_000  # jobs started but not ended; the oldest are forgotten past it


@dataclass
class _Node:
    state: str | None = None
    in_service: bool = False
    removed: bool = False
    planned: bool = False  # inside node.maintenance start..end
    maint_state: bool = False  # in one of SloConfig.maintenance_states
    since: float | None = None  # time of the last accounting
    incident_at: float | None = None  # condition set (first FAILED finding) not yet resolved
    out_at: float | None = None  # left service (a drain episode), not yet back
    repaired: bool = False  # a repair happened during the drain episode
    drained: bool = False  # the episode reached a drain state
    human: bool = False  # the episode reached a state only a person ends
    failing: set[tuple[str, str]] = field(default_factory=set)
    faults: deque[float] = field(default_factory=lambda: deque(maxlen=16))


@dataclass
class _Job:
    start: float
    gpus: int = 0
    lost_s: float = 0.0


def _num(x: object) -> float | None:
    """A finite, non-negative number from event data, else None (bools are not numbers)."""
    if (type(x) is int or type(x) is float) and math.isfinite(x) and x >= 0:  # type: ignore[arg-type]
        return float(x)  # type: ignore[arg-type]
    return None


class SloTracker:
    """Feed events in time order; `finish()` returns the SloReport for [start, end].

    Events before `start` only establish state (a node's state when the window opens);
    events after `end` are ignored. Without `start`, the window opens at the first event;
    without `end`, it closes at the last.
    """

    def __init__(
        self,
        *,
        start: float | None = None,
        end: float | None = None,
        targets: Targets | None = None,
        config: SloConfig | None = None,
    ) -> None:
        self.cfg = config or SloConfig()
        self.r = SloReport(start=start, end=end, targets=targets or Targets())
        self.r.timeline = Timeline(start=start, end=end)
        self._nodes: dict[str, _Node] = {}
        self._jobs: dict[str, _Job] = {}
        self._last: float | None = None
        self._first: float | None = None  # the first event's time: when the log began

    # --- helpers -------------------------------------------------------------------------
    def _in_window(self, ts: float) -> bool:
        r = self.r
        return (r.start is None or ts >= r.start) and (r.end is None or ts <= r.end)

    def _account(self, name: str, n: _Node, ts: float) -> None:
        """Add node-time from n.since to ts (clipped to the window) in n's current state."""
        if n.since is None or n.removed or n.state is None:
            n.since = ts
            return
        if ts < n.since:
            return  # a late event (writers interleave): it takes effect at n.since, no double count
        a = n.since if self.r.start is None else max(n.since, self.r.start)
        b = ts if self.r.end is None else min(ts, self.r.end)
        n.since = ts
        if b <= a:
            return
        dur = b - a
        self.r.node_seconds += dur
        maint = n.planned or n.maint_state
        if maint:
            self.r.maintenance_seconds += dur
        elif n.in_service:
            self.r.in_service_seconds += dur
        else:
            self.r.node_downtime_s[name] = self.r.node_downtime_s.get(name, 0.0) + dur
        assert self.r.timeline is not None
        self.r.timeline.add(a, b, in_service=n.in_service, maintenance=maint)

    # --- events --------------------------------------------------------------------------
    def feed(self, ev: Event) -> None:
        r = self.r
        if r.start is None:
            r.start = ev.ts
            assert r.timeline is not None
            r.timeline.start = ev.ts
        if r.end is not None and ev.ts > r.end:
            return
        self._last = ev.ts if self._last is None else max(self._last, ev.ts)
        if self._first is None:
            self._first = ev.ts
        handler = _HANDLERS.get(ev.kind)
        if handler is not None:
            handler(self, ev)

    def _node(self, ev: Event) -> tuple[str, _Node] | None:
        if ev.node is None:
            return None
        n = self._nodes.get(ev.node)
        if n is None:
            n = self._nodes[ev.node] = _Node()
        return ev.node, n

    def _on_state(self, ev: Event) -> None:
        got = self._node(ev)
        if got is None:
            return
        name, n = got
        to = str(ev.data.get("to", ""))
        if ev.data.get("dry_run") is True:
            return  # the controller only said what it would do
        if n.state is None and isinstance(ev.data.get("from"), str) and self._first is not None:
            # A controller that only reports transitions: the node was in `from` since the
            # log began (the controller should also write one `from: null` event per node
            # at startup, so that nodes that never change are counted; see docs/events.md).
            self._seed(n, str(ev.data["from"]), self._first)
        self._account(name, n, ev.ts)
        was_in = n.in_service and n.state is not None
        flag = ev.data.get("in_service")
        n.in_service = flag if isinstance(flag, bool) else to in self.cfg.in_service_states
        n.removed = to in self.cfg.removed_states
        entering_maint = to in self.cfg.maintenance_states
        n.maint_state = entering_maint
        n.state = to
        if n.out_at is not None and entering_maint:
            n.repaired = True  # a person took the node for repair
        if was_in and not n.in_service and not (entering_maint or n.planned or n.removed):
            n.out_at, n.repaired, n.drained = ev.ts, False, False
            if n.incident_at is None:
                n.incident_at = ev.ts
        if n.out_at is not None and to in self.cfg.drain_states:
            n.drained = True
        if n.out_at is not None and to in self.cfg.human_states:
            n.human = True
        if n.in_service and n.out_at is not None:
            if self._in_window(ev.ts):
                r = self.r
                r.mttr.add(ev.ts - (n.incident_at if n.incident_at is not None else n.out_at))
                if not n.drained:
                    r.cordons += 1
                else:
                    r.drains += 1
                    if n.human:  # a person ended it: their verdict, not a false positive
                        r.human_releases += 1
                    elif not n.repaired:
                        r.false_positive_drains += 1
            n.out_at, n.incident_at = None, None
            n.repaired = n.drained = n.human = False
            n.failing.clear()

    def _seed(self, n: _Node, state: str, since: float) -> None:
        n.state, n.since = state, since
        n.in_service = state in self.cfg.in_service_states
        n.maint_state = state in self.cfg.maintenance_states
        n.removed = state in self.cfg.removed_states

    def _on_maintenance(self, ev: Event) -> None:
        got = self._node(ev)
        if got is None:
            return
        name, n = got
        self._account(name, n, ev.ts)
        n.planned = ev.data.get("phase") == "start"
        if n.planned and n.out_at is not None:
            n.repaired = True

    def _on_finding_set(self, ev: Event) -> None:
        got = self._node(ev)
        if got is None or str(ev.data.get("status", "FAILED")) != "FAILED":
            return
        _, n = got
        evidence = _num(ev.data.get("evidence_ts"))
        first = evidence if evidence is not None and evidence <= ev.ts else None
        if first is None and n.faults:
            first = n.faults.popleft()
        if first is not None and self._in_window(ev.ts):
            self.r.mttd.add(ev.ts - first)
        if n.incident_at is None:
            n.incident_at = ev.ts
        n.failing.add((str(ev.data.get("code", "")), str(ev.data.get("component", ""))))

    def _on_finding_cleared(self, ev: Event) -> None:
        got = self._node(ev)
        if got is None:
            return
        _, n = got
        n.failing.discard((str(ev.data.get("code", "")), str(ev.data.get("component", ""))))
        if not n.failing and n.out_at is None and n.incident_at is not None:
            if self._in_window(ev.ts):
                self.r.incidents_absorbed += 1
            n.incident_at = None

    def _on_remediation(self, ev: Event) -> None:
        got = self._node(ev)
        if got is None:
            return
        _, n = got
        action = str(ev.data.get("action", "")).upper()
        if (
            n.out_at is not None
            and ev.data.get("result") == "succeeded"
            and action in self.cfg.repair_actions
            and ev.data.get("found") is not False
        ):
            n.repaired = True

    def _on_fault(self, ev: Event) -> None:
        got = self._node(ev)
        if got is not None:
            got[1].faults.append(ev.ts)

    def _on_breaker(self, ev: Event) -> None:
        restored = ev.data.get("restored") is True  # a restarted controller, not a new trip
        if ev.data.get("state") == "open" and not restored and self._in_window(ev.ts):
            self.r.breaker_trips += 1

    def _on_job_start(self, ev: Event) -> None:
        if ev.job is None:
            return
        gpus = ev.data.get("gpus", 0)
        gpus = gpus if type(gpus) is int and gpus > 0 else 0
        job = self._jobs.get(ev.job)
        if job is not None:  # a restart's new attempt: the job, its start and losses go on
            job.gpus = gpus or job.gpus
            return
        self._jobs[ev.job] = _Job(start=ev.ts, gpus=gpus)
        if len(self._jobs) > self.cfg.max_open_jobs:
            del self._jobs[next(iter(self._jobs))]

    def _on_job_restart(self, ev: Event) -> None:
        job = self._jobs.get(ev.job or "")
        lost = _num(ev.data.get("lost_s"))
        if job is not None and lost is not None:
            job.lost_s += lost
        if self._in_window(ev.ts):
            self.r.job_restarts += 1

    def _on_job_end(self, ev: Event) -> None:
        d = ev.data
        result = str(d.get("result", "succeeded" if d.get("exit_code", 0) == 0 else "failed"))
        if interrupted(result, d.get("exit_code")):
            return  # the job goes on: its verdict is its last attempt's
        job = self._jobs.pop(ev.job or "", None)
        if not self._in_window(ev.ts):
            return
        r = self.r
        alloc, prod = _num(d.get("allocated_gpu_s")), _num(d.get("productive_gpu_s"))
        if alloc is None and job is not None and job.gpus:
            alloc = job.gpus * max(0.0, ev.ts - job.start)
        if result == "succeeded":
            r.jobs_succeeded += 1
            r.succeeded_gpu_s += alloc or 0.0
        elif result == "cancelled":
            r.jobs_cancelled += 1
        else:
            r.jobs_failed += 1
            r.failed_gpu_s += alloc or 0.0
            prod = 0.0  # a job that gave up produced nothing: its work is lost
        self._goodput(alloc, prod, job)
        if job is not None:
            self._ettr(job, ev.ts, prod)

    def _goodput(self, alloc: float | None, prod: float | None, job: _Job | None) -> None:
        """Add a job's allocated and productive GPU-time (productive, when not given: the
        allocation less the work its restarts lost)."""
        if prod is None and job is not None and alloc is not None:
            prod = max(0.0, alloc - job.gpus * job.lost_s)
        if alloc is not None and prod is not None and alloc > 0:
            self.r.allocated_gpu_s += alloc
            self.r.productive_gpu_s += min(prod, alloc)

    def _ettr(self, job: _Job, end: float, prod: float | None) -> None:
        """Add a job's wall GPU-time from its start to `end` and its productive share: the
        productive GPU-time its job.end reports, else the wall time less what its restarts
        lost (`lost_s` runs from the checkpoint resumed to the restart: recomputation, the
        restart, and any time the job spent off the cluster after a drain)."""
        if not job.gpus:
            return
        wall = job.gpus * max(0.0, end - job.start)
        if prod is None:
            prod = wall - job.gpus * job.lost_s
        self.r.ettr_wall_gpu_s += wall
        self.r.ettr_productive_gpu_s += min(max(0.0, prod), wall)

    def finish(self) -> SloReport:
        r = self.r
        if r.end is None:
            r.end = self._last
            assert r.timeline is not None
            r.timeline.end = r.end
        if r.end is not None:
            for name, n in self._nodes.items():
                if n.state is not None:
                    self._account(name, n, r.end)
            # Jobs still running are censored: no verdict on success, but their time so far
            # counts for goodput (a run that never ends still shows what it lost).
            for job in self._jobs.values():
                if job.start <= r.end and (r.start is None or job.start >= r.start):
                    r.jobs_censored += 1
                    if job.gpus:
                        self._goodput(job.gpus * max(0.0, r.end - job.start), None, job)
                    self._ettr(job, r.end, None)
        return r


def interrupted(result: str, exit_code: object) -> bool:
    """A job.end that is no verdict: an attempt that stopped with a code a retry spares (a
    drain, a refused node) is followed by the same job resuming elsewhere. So a drained job
    that resumes and finishes is one job that succeeded, whichever process wrote last."""
    if result == "interrupted":
        return True
    code = exit_code if type(exit_code) is int else None
    return (
        result == "failed"
        and code is not None
        and exit_codes.lookup(code).retry is exit_codes.Retry.IGNORE
    )


_HANDLERS = {
    Kind.NODE_STATE.value: SloTracker._on_state,
    Kind.MAINTENANCE.value: SloTracker._on_maintenance,
    Kind.FINDING_SET.value: SloTracker._on_finding_set,
    Kind.FINDING_CLEARED.value: SloTracker._on_finding_cleared,
    Kind.REMEDIATION.value: SloTracker._on_remediation,
    Kind.BREAKER.value: SloTracker._on_breaker,
    Kind.JOB_START.value: SloTracker._on_job_start,
    Kind.JOB_RESTART.value: SloTracker._on_job_restart,
    Kind.JOB_END.value: SloTracker._on_job_end,
    Kind.FAULT.value: SloTracker._on_fault,
}


def compute(
    events: Iterable[Event],
    *,
    start: float | None = None,
    end: float | None = None,
    targets: Targets | None = None,
    config: SloConfig | None = None,
) -> SloReport:
    """The SLO report of a time-ordered event stream over [start, end]."""
    t = SloTracker(start=start, end=end, targets=targets, config=config)
    for ev in events:
        t.feed(ev)
    return t.finish()
