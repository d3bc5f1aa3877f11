"""Runs every registered check on its own schedule, each under its own deadline.

Called by the agent (`gpuvigil.node.agent`). Isolation is the point, after
node-problem-detector's known failure where one plugin stuck on a process in the driver
blocked every other plugin:
- every check runs on a thread of its own, so a slow or hung check delays nothing else.
  The threads are kept between runs (one per check, plus one that watches deadlines):
  starting threads on every sweep cost the agent more CPU than the checks' own reads;
- at the deadline the run is CHECK_TIMEOUT; if the check's code is *still* running after
  that (a call stuck in the kernel), it is never relaunched on top of itself: each time it
  falls due it is reported CHECK_TIMEOUT again, with how long it has been stuck, until it
  finally returns (its late result is dropped: the next run reads afresh);
- a result older than `stale_factor` x its interval is RESULT_STALE (FAILED), and the
  problems it last saw are kept: not seeing a problem any more is not the same as seeing
  it gone.
The scheduler owns no clock of its own: `tick` and `snapshot` take monotonic and wall times.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuvigil.core.findings import Action, CheckRun, Finding, Status
from gpuvigil.node.checks import CheckContext, CheckSpec, call, missing_needs, timed_out

OnResult = Callable[[list[Finding], CheckRun], None]
RERUN_POLL_S = 0.2


@dataclass
class Slot:
    """One check's schedule, its latest result, and the run under way."""

    spec: CheckSpec
    next_due: float = 0.0  # monotonic
    stuck_since: float | None = None  # monotonic: the check's code outlived its deadline
    findings: list[Finding] = field(default_factory=list)
    run: CheckRun | None = None
    completed_at: float | None = None  # monotonic time of the latest result
    rerun: bool = False  # asked to run again as soon as the current run ends
    busy_since: float | None = None  # monotonic start of the run under way (None: idle)
    started_at: datetime | None = None  # its wall-clock start
    timed_out: bool = False  # the run under way passed its deadline (reported as such)
    pending: bool = False  # handed to the slot's thread, not yet picked up
    thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.spec.name


class Scheduler:
    def __init__(
        self,
        specs: Iterable[CheckSpec],
        ctx: CheckContext,
        *,
        stale_factor: float = 2.0,
        on_result: OnResult | None = None,
        disabled: Iterable[str] = (),
        first_delay_s: Mapping[str, float] | None = None,
    ) -> None:
        self.ctx = ctx
        # Seconds after the first tick before a check's first run (fleet-wide splay of
        # expensive checks, so a DaemonSet rollout does not start every DCGM diag at once).
        self.first_delay_s = dict(first_delay_s or {})
        self.stale_factor = stale_factor
        self._on_result = on_result
        self._lock = threading.Lock()  # the results
        self._cv = threading.Condition()  # the runs under way; wakes the threads
        self._watch: threading.Thread | None = None
        self._closed = False
        self.slots = [Slot(spec) for spec in sorted(specs, key=lambda s: s.name)]
        self.disabled = sorted(set(disabled))
        self.changed = threading.Event()  # set whenever a result lands

    # --- running --------------------------------------------------------------------------
    def tick(self, now: float) -> float:
        """Launch every due check; returns the monotonic time of the next due check."""
        for slot in self.slots:
            if slot.next_due == 0.0 and self.first_delay_s.get(slot.name, 0.0) > 0:
                slot.next_due = now + self.first_delay_s[slot.name]
                continue
            if now >= slot.next_due:
                if slot.rerun and slot.busy_since is not None:
                    slot.next_due = now + RERUN_POLL_S  # after the run under way ends
                    continue
                slot.next_due = now + slot.spec.interval_s
                slot.rerun = False
                self._launch(slot, now)
        return min((s.next_due for s in self.slots), default=now + 1.0)

    def _launch(self, slot: Slot, now: float) -> None:
        with self._cv:
            busy, stuck = slot.busy_since is not None, slot.timed_out
            if not busy:
                slot.stuck_since = None
                slot.busy_since, slot.started_at = now, datetime.now(UTC)
                slot.timed_out, slot.pending = False, True
                self._start_threads(slot)
                self._cv.notify_all()
        if not busy or not stuck:
            return  # launched; or still within its deadline, which will answer
        # The check's own code is still stuck past its deadline: never start a second
        # copy on top of it. Report it again so it stays CHECK_TIMEOUT, not stale.
        slot.stuck_since = slot.stuck_since or now
        stuck_s = now - slot.stuck_since + slot.spec.timeout_s
        finding = Finding(
            check=slot.name,
            status=Status.FAILED,
            code="CHECK_TIMEOUT",
            message=(
                f"still running {stuck_s:.0f} s after it started (deadline "
                f"{slot.spec.timeout_s:g} s); not relaunched until it returns"
            ),
            evidence={"stuck_for_s": round(stuck_s, 1), "relaunched": False},
        )
        run = CheckRun(
            check=slot.name, status=Status.FAILED, started_at=datetime.now(UTC), duration_s=0.0
        )
        self._record(slot, [finding], run, now)

    def _start_threads(self, slot: Slot) -> None:
        """The slot's own thread and the deadline watcher, once (kept for the agent's life)."""
        if slot.thread is None:
            slot.thread = threading.Thread(
                target=self._serve, args=(slot,), name=f"check:{slot.name}", daemon=True
            )
            slot.thread.start()
        if self._watch is None:
            self._watch = threading.Thread(target=self._deadlines, name="deadlines", daemon=True)
            self._watch.start()

    def _serve(self, slot: Slot) -> None:
        """The slot's thread: one run per launch, for as long as the agent lives."""
        while True:
            with self._cv:
                while not slot.pending and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                slot.pending = False
            started_at, t0 = slot.started_at or datetime.now(UTC), time.monotonic()
            missing = missing_needs(slot.spec, self.ctx)
            if missing and not slot.spec.required:
                findings, run = _disabled(slot.spec, missing)
            else:
                findings = missing or call(slot.spec, self.ctx)
                run = CheckRun(
                    check=slot.name,
                    status=Status.worst(f.status for f in findings),
                    started_at=started_at,
                    duration_s=time.monotonic() - t0,
                    disabled=bool(findings) and all(f.code == "CHECK_DISABLED" for f in findings),
                )
            with self._cv:
                late, slot.busy_since, slot.timed_out = slot.timed_out, None, False
            if not late:  # a run past its deadline was reported CHECK_TIMEOUT already
                self._record(slot, findings, run, time.monotonic())

    def _deadlines(self) -> None:
        """Reports each run that passes its deadline as CHECK_TIMEOUT, at the deadline."""
        while True:
            with self._cv:
                if self._closed:
                    return
                now = time.monotonic()
                running = [s for s in self.slots if s.busy_since is not None and not s.timed_out]
                expired = [s for s in running if now >= s.busy_since + s.spec.timeout_s]  # type: ignore[operator]
                for s in expired:
                    s.timed_out = True
                if not expired:
                    ends = [s.busy_since + s.spec.timeout_s for s in running]  # type: ignore[operator]
                    self._cv.wait(min(ends) - now if ends else None)
                    continue
            for s in expired:
                run = CheckRun(
                    check=s.name,
                    status=Status.FAILED,
                    started_at=s.started_at or datetime.now(UTC),
                    duration_s=s.spec.timeout_s,
                )
                self._record(s, [timed_out(s.spec)], run, time.monotonic())

    def close(self) -> None:
        """Let the idle threads end (a thread stuck in a check ends when the check does)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _record(self, slot: Slot, findings: list[Finding], run: CheckRun, now: float) -> None:
        with self._lock:
            slot.findings, slot.run, slot.completed_at = list(findings), run, now
        if self._on_result is not None:
            self._on_result(list(findings), run)
        self.changed.set()

    def run_soon(self, names: Iterable[str]) -> None:
        """Run these checks at the next tick (their readings changed: a GPU reset)."""
        wanted = set(names)
        for slot in self.slots:
            if slot.name in wanted:
                slot.next_due = min(slot.next_due, 1e-9)  # due; 0.0 would mean "first run"
                slot.rerun = True
        self.changed.set()

    def ran_since(self, name: str, started_after: datetime) -> bool:
        """True once a run of `name` that started after `started_after` has a result."""
        with self._lock:
            slot = next((s for s in self.slots if s.name == name), None)
            if slot is None:
                return True  # not scheduled here: nothing to wait for
            return slot.run is not None and slot.run.started_at >= started_after

    # --- reading --------------------------------------------------------------------------
    def first_sweep_done(self, groups: tuple[str, ...] = ("fast", "slow")) -> bool:
        """True once every check of these groups has a result (each is bounded by its
        deadline, so this happens at most max(timeout_s) after start)."""
        return all(s.run is not None for s in self.slots if s.spec.group in groups)

    def snapshot(self, now: float) -> tuple[list[Finding], list[CheckRun]]:
        """Latest findings of every check, with staleness applied, plus the disabled ones."""
        findings: list[Finding] = []
        runs: list[CheckRun] = []
        with self._lock:
            for slot in self.slots:
                if slot.run is None or slot.completed_at is None:
                    continue
                runs.append(slot.run)
                findings.extend(slot.findings)
                age = now - slot.completed_at
                # A deadline longer than the interval (tests, odd configs) must not make a
                # healthy run look stale.
                limit = self.stale_factor * max(slot.spec.interval_s, slot.spec.timeout_s)
                if age > limit:
                    findings.append(
                        stale_finding(slot.name, age_s=age, limit_s=limit, last=slot.findings)
                    )
        for name in self.disabled:
            findings.append(
                Finding(
                    check=name,
                    status=Status.WARNING,
                    code="CHECK_DISABLED",
                    message="switched off in the agent config (agent.checks.<name>.enabled)",
                )
            )
            runs.append(
                CheckRun(
                    check=name,
                    status=Status.WARNING,
                    started_at=datetime.now(UTC),
                    duration_s=0.0,
                    disabled=True,
                )
            )
        return findings, runs


def stale_finding(check: str, *, age_s: float, limit_s: float, last: list[Finding]) -> Finding:
    """RESULT_STALE for a check (or stream) whose latest result is too old to trust."""
    return Finding(
        check=check,
        status=Status.FAILED,
        code="RESULT_STALE",
        action=Action.NONE,
        message=f"latest result is {age_s:.0f} s old (limit {limit_s:g} s)",
        evidence={
            "age_s": round(age_s, 1),
            "limit_s": limit_s,
            "last_codes": sorted({f.code for f in last}),
        },
    )


def _disabled(spec: CheckSpec, missing: list[Finding]) -> tuple[list[Finding], CheckRun]:
    """An optional check (spec.required False) whose tool is absent: reported, not failed."""
    what = "; ".join(f.message for f in missing)
    finding = Finding(
        check=spec.name,
        status=Status.OK,
        code="CHECK_DISABLED",
        message=f"optional check not run: {what}",
        evidence={"missing": [f.evidence.get("need") for f in missing]},
    )
    run = CheckRun(
        check=spec.name,
        status=Status.OK,
        started_at=datetime.now(UTC),
        duration_s=0.0,
        disabled=True,
    )
    return [finding], run


def with_schedule(spec: CheckSpec, *, interval_s: float, timeout_s: float) -> CheckSpec:
    return dataclasses.replace(spec, interval_s=interval_s, timeout_s=timeout_s)
