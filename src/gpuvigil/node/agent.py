"""The node agent (`gpuvigil agent`): its settings (the `agent:` section) and its loop.

Called by `gpuvigil.commands.agent`. The loop is small on purpose: it launches due
checks (`scheduler`), gathers the latest results of the checks and of the kernel-log
stream (`kernel_watch`) into one NodeReport, and hands it to every sink's own thread
(`sinks`). It never runs check code or talks to the network itself, so nothing it does
can hang; the self-watchdog (`watchdog`) exits the process if it ever stops beating.
Composition (which checks, which sinks) lives in `gpuvigil.node.compose`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.core.findings import Finding, NodeReport, utcnow
from gpuvigil.node.checks.gpu.readings import GpuReset, GpuResets
from gpuvigil.node.kernel_watch import KernelStreamConfig, KernelWatch
from gpuvigil.node.metrics import AgentMetrics, observe_report
from gpuvigil.node.scheduler import Scheduler
from gpuvigil.node.sinks import SinkWorker
from gpuvigil.node.sinks.http import HttpConfig
from gpuvigil.node.sinks.kubernetes import KubernetesConfig
from gpuvigil.node.sinks.slurm import SlurmConfig
from gpuvigil.node.sinks.state_file import StateFileConfig
from gpuvigil.node.watchdog import Watchdog

log = logging.getLogger("gpuvigil.agent")
LOOP_BEAT_S = 5.0  # far below watchdog_timeout_s and /healthz's 10 s loop-age limit
RERUN_AFTER_RESET = ("gpu",)  # a GPU reset changes what these read (ECC, remaps, recovery)


class CheckSchedule(StrictModel):
    """Per-check override of what the group and the check's own declaration say."""

    enabled: bool = Field(True, description="False: not run, reported as CHECK_DISABLED.")
    interval_s: float | None = Field(None, gt=0, description="None: the group's interval.")
    timeout_s: float | None = Field(None, gt=0, description="None: the check's own deadline.")


class SinksConfig(StrictModel):
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    state_file: StateFileConfig = Field(default_factory=StateFileConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)


class AgentConfig(StrictModel):
    """The `agent:` section. Every interval is in seconds."""

    node_name: str | None = Field(
        None,
        description="None: $NODE_NAME (the Kubernetes downward API), else the short "
        "host name (what Slurm calls the node on most sites).",
    )
    sysfs_root: Path = Field(
        Path("/"),
        description="Checks read /sys and /dev below this root: point it at a "
        "captured or fake tree to try the agent without the hardware.",
    )
    fast_interval_s: float = Field(
        30.0,
        gt=0,
        description="NVML status, fabric, PCIe, topology. 30 s: an Xid-free "
        "fault (a link down, a lost GPU) is seen within half a minute, at well under 0.1% "
        "of a core.",
    )
    slow_interval_s: float = Field(
        300.0,
        gt=0,
        description="`dcgmi health` and other checks that cost more or change "
        "slowly. 5 min: DCGM's own watches update at that scale.",
    )
    diag_interval_s: float = Field(
        21600.0,
        gt=0,
        description="A short DCGM diagnostic (when DCGM is installed). "
        "6 h: it briefly loads the GPUs, so it runs rarely.",
    )
    diag_splay_s: float = Field(
        3600.0,
        ge=0,
        description="The first diag run waits a random 0..this many seconds "
        "(at most one diag interval): a fleet-wide rollout must not load every GPU of the "
        "fleet with a DCGM diag in the same minute. New nodes are validated by preflight.",
    )
    checks: dict[str, CheckSchedule] = Field(
        default_factory=dict, description="Per-check overrides, by check name."
    )
    check_modules: list[str] = Field(
        default_factory=list,
        description="Extra Python modules to import that register "
        "site-specific checks with `@gpuvigil.node.checks.check`.",
    )
    stale_factor: float = Field(
        2.0,
        ge=1,
        description="A result older than this many intervals (or deadlines, if "
        "longer) is RESULT_STALE: one missed run is tolerated, two are not.",
    )
    publish_interval_s: float = Field(
        30.0,
        gt=0,
        description="Re-publish to every sink at least this often even when "
        "nothing changed (changes are published at once). Sinks that write remote state "
        "throttle further with their own heartbeat_interval_s.",
    )
    sink_failure_grace_s: float = Field(
        300.0,
        gt=0,
        description="/healthz fails (503) once a sink has failed every attempt for this "
        "long: a node name that does not exist or credentials that were revoked are then a "
        "restart the supervisor shows (CrashLoopBackOff), not a silently stale verdict. "
        "Long enough to ride out an API server restart. The state file has no grace: its "
        "first failed write fails /healthz.",
    )
    watchdog_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Exit (status 3) when the loop has not beaten for this long, "
        "so the supervisor restarts the agent. Far above the loop's 5 s beat.",
    )
    events_file: Path | None = Field(
        None,
        description="Append finding.set/finding.cleared events (JSONL, "
        "docs/events.md) here for `gpuvigil report`. None: no event log.",
    )
    state_dir: Path | None = Field(
        Path("/var/lib/gpuvigil"),
        description="Where the agent keeps what must outlive a "
        "reboot: the kernel-log events that call for REPLACE or INVESTIGATE (the kernel "
        "log starts empty at every boot; docs/kernel-log.md), and the `released-at` "
        "marker. Persistent (not /run, which is tmpfs), small (bounded to 256 events). "
        "None: nothing is kept, and a reboot forgets such an Xid.",
    )
    kernel_log: KernelStreamConfig = Field(
        default_factory=KernelStreamConfig, description="The kernel log as a stream."
    )
    sinks: SinksConfig = Field(
        default_factory=SinksConfig, description="Where reports go (any combination)."
    )


class Agent:
    """The loop. Built by `compose.build_agent`; tests build it directly."""

    def __init__(
        self,
        *,
        node: str,
        config: AgentConfig,
        scheduler: Scheduler,
        kernel: KernelWatch | None,
        workers: list[SinkWorker],
        metrics: AgentMetrics,
        watchdog: Watchdog | None = None,
        events: EventWriter | None = None,
        first_publish_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node, self.config, self.scheduler, self.kernel = node, config, scheduler, kernel
        self.workers, self.metrics, self.watchdog, self.events = workers, metrics, watchdog, events
        self.first_publish_timeout_s = first_publish_timeout_s
        self.clock = clock
        self.latest: NodeReport | None = None
        self.last_publish: float | None = None
        self._stop = threading.Event()
        self._wake = scheduler.changed
        self._previous: dict[tuple[str, str, str], Finding] = {}
        self.started = clock()

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        for w in self.workers:
            w.start()
        if self.kernel is not None:
            self.kernel.start()
        if self.watchdog is not None:
            self.watchdog.start()
        next_publish = 0.0
        while not self._stop.is_set():
            now = self.clock()
            self._beat()
            next_due = self.scheduler.tick(now)
            changed = self._wake.is_set()
            if self._ready(now) and (changed or now >= next_publish):
                self._wake.clear()
                self.publish(now)
                next_publish = now + self.config.publish_interval_s
            wait = min(next_due, next_publish) - self.clock()
            # Sleep until something is due or a result lands; beat at least every
            # LOOP_BEAT_S so the watchdog and /healthz see a live loop.
            if self._wake.wait(max(0.0, min(wait, LOOP_BEAT_S))):
                self._stop.wait(0.05)  # let results landing together go out as one report
        self._shutdown()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _beat(self) -> None:
        if self.watchdog is not None:
            self.watchdog.beat()
        self.metrics.loop_last.set(time.time())

    def _ready(self, now: float) -> bool:
        """Publish nothing before the first sweep: an empty report would read as healthy."""
        if self.latest is not None:
            return True
        if now - self.started > self.first_publish_timeout_s:
            return True  # unfinished checks are then reported as what they are
        kernel_ready = self.kernel is None or self.kernel.ready.is_set()
        return kernel_ready and self.scheduler.first_sweep_done()

    def build_report(self, now: float) -> NodeReport:
        findings, runs = self.scheduler.snapshot(now)
        if self.kernel is not None:
            kf, kr = self.kernel.snapshot(now)
            findings, runs = findings + kf, runs + kr
        return NodeReport(
            node=self.node, generated_at=utcnow(), findings=tuple(findings), checks=tuple(runs)
        )

    def publish(self, now: float) -> NodeReport:
        report = self.build_report(now)
        observe_report(self.metrics, report)
        self._record_transitions(report)
        self.latest, self.last_publish = report, now
        for w in self.workers:
            w.submit(report)
        return report

    def _record_transitions(self, report: NodeReport) -> None:
        current = {f.key: f for f in report.problems}
        for key, f in current.items():
            old = self._previous.get(key)
            if old is None or old.status is not f.status:
                log.warning("finding %s %s %s: %s", f.status.value, f.code, f.component, f.message)
                self._event(Kind.FINDING_SET, f)
        for key, f in self._previous.items():
            if key not in current:
                log.info("finding cleared: %s %s", f.code, f.component)
                self._event(Kind.FINDING_CLEARED, f)
        self._previous = current

    def _event(self, kind: Kind, f: Finding) -> None:
        if self.events is None:
            return
        data = {
            "code": f.code,
            "component": f.component,
            "status": f.status.value,
            "action": f.action.value,
            "fatal": f.fatal,
            "check": f.check,
            "message": f.message,
        }
        if kind is Kind.FINDING_SET:  # for MTTD: the first evidence, e.g. the Xid line's time
            data["evidence_ts"] = f.observed_at.timestamp()
        try:
            self.events.write(
                Event(ts=time.time(), kind=kind.value, source="agent", node=self.node, data=data)
            )
        except OSError as e:
            log.warning("event log write failed: %s", e)

    # --- after a remediation -----------------------------------------------------------------
    def after_reset(self, reset: GpuReset, *, timeout_s: float = 90.0) -> bool:
        """A GPU reset succeeded (called on the remediator's thread before it answers
        `succeeded`). The reset becomes a fact of the kernel-log rule (the reset-class Xids
        it cured clear), the checks whose readings it changed run again, and this returns
        once every sink holds a report that has both, so the controller's validation
        never judges the verdict from before the reset. False when `timeout_s` passed."""
        if self.kernel is not None:
            self.kernel.record_reset(reset)
        else:
            facts = self.scheduler.ctx.facts
            facts.put((facts.get(GpuResets) or GpuResets()).with_(reset))
        end = self.clock() + timeout_s
        mark = utcnow()
        self.scheduler.run_soon(RERUN_AFTER_RESET)
        self._wake.set()
        while not all(self.scheduler.ran_since(n, mark) for n in RERUN_AFTER_RESET):
            if self._stop.wait(0.05) or self.clock() > end:
                return False
        fresh = utcnow()
        self._wake.set()
        while not all(
            w.published is not None and w.published.generated_at >= fresh for w in self.workers
        ):
            if self._stop.wait(0.05) or self.clock() > end:
                return False
        return True

    # --- health (/healthz) ------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, object]]:
        now = self.clock()
        loop_age = self.watchdog.age_s() if self.watchdog is not None else 0.0
        pub_age = None if self.last_publish is None else now - self.last_publish
        fresh_limit = 3 * self.config.publish_interval_s
        ok = loop_age < min(10.0, self.config.watchdog_timeout_s)
        if pub_age is None:
            ok = ok and now - self.started < self.first_publish_timeout_s + fresh_limit
        else:
            ok = ok and pub_age < fresh_limit
        mono = time.monotonic()
        failing = {
            w.sink.name: round(mono - w.failing_since, 1)
            for w in self.workers
            if w.failing_since is not None
        }
        grace = {  # a sink may need less grace than the API-server default (state_file: 0)
            w.sink.name: getattr(w.sink, "failure_grace_s", self.config.sink_failure_grace_s)
            for w in self.workers
        }
        stuck = {n: s for n, s in failing.items() if s >= grace[n]}
        ok = ok and not stuck
        status = self.latest.status.value if self.latest else None
        return ok, {
            "ok": ok,
            "loop_age_s": round(loop_age, 2),
            "publish_age_s": None if pub_age is None else round(pub_age, 2),
            "node": self.node,
            "status": status,
            "sinks": {w.sink.name: w.last_error or "ok" for w in self.workers},
            "sinks_failing_s": failing,
            "sink_failure_grace_s": self.config.sink_failure_grace_s,
        }

    def _shutdown(self) -> None:
        self.scheduler.close()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.kernel is not None:
            self.kernel.stop()
        for w in self.workers:
            w.stop()
        if self.events is not None:
            self.events.close()
