"""Runs every registered check on its own schedule, each under its own deadline.

Called by the agent (`gpuvigil.node.agent`). Isolation is the point, after
node-problem-detector's known failure where one plugin stuck on a process in the driver
blocked every other plugin:
- every run happens on a thread of its own, so a slow or hung check delays nothing else;
- `run_check` returns CHECK_TIMEOUT at the deadline; if the check's code is *still*
  running after that (a call stuck in the kernel), it is never relaunched on top of
  itself: each time it falls due it is reported CHECK_TIMEOUT again, with how long it has
  been stuck, until it finally returns;
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
from gpuvigil.node.checks import CheckContext, CheckSpec, missing_needs, run_check

OnResult = Callable[[list[Finding], CheckRun], None]
RERUN_POLL_S = 0.2


@dataclass
class Slot:
    """One check's schedule and its latest result."""

    spec: CheckSpec
    next_due: float = 0.0  # monotonic
    worker: threading.Thread | None = None
    stuck_since: float | None = None  # monotonic: the check's code outlived its deadline
    findings: list[Finding] = field(default_factory=list)
    run: CheckRun | None = None
    completed_at: float | None = None  # monotonic time of the latest result
    rerun: bool = False  # asked to run again as soon as the current run ends

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
        self._lock = threading.Lock()
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
                if slot.rerun and slot.worker is not None and slot.worker.is_alive():
                    slot.next_due = now + RERUN_POLL_S  # after the run under way ends
                    continue
                slot.next_due = now + slot.spec.interval_s
                slot.rerun = False
                self._launch(slot, now)
        return min((s.next_due for s in self.slots), default=now + 1.0)

    def _launch(self, slot: Slot, now: float) -> None:
        if slot.worker is not None and slot.worker.is_alive():
            return  # our wrapper is still inside run_check; its deadline will answer
        if _abandoned_alive(slot.name):
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
            return
        slot.stuck_since = None
        slot.worker = threading.Thread(
            target=self._run_one, args=(slot,), name=f"sched:{slot.name}", daemon=True
        )
        slot.worker.start()

    def _run_one(self, slot: Slot) -> None:
        missing = [] if slot.spec.required else missing_needs(slot.spec, self.ctx)
        if missing:
            findings, run = _disabled(slot.spec, missing)
        else:
            findings, run = run_check(slot.spec, self.ctx)
        self._record(slot, findings, run, time.monotonic())

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


def _abandoned_alive(name: str) -> bool:
    """`run_check` runs the check's code on a thread named `check:<name>` and abandons it
    at the deadline; while that thread lives, the check is stuck."""
    return any(t.name == f"check:{name}" and t.is_alive() for t in threading.enumerate())


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
