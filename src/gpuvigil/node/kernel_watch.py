"""The kernel log as a stream, turned into findings: the agent's `kernel_log_stream` check.

Called by the agent. Owns the reader thread (`probes.kmsg_stream`), feeds each record to
the layer-1 kernel-log parser (`xid_feed`), and answers `snapshot(now)` with the findings
the next report carries: the `xid` rule's findings over the stream's KernelLog reading,
judged by `node.pipeline` with the node's facts (the `gpu` check's inventory and NVML's
own Xid events, the remediator's GPU resets, a person's release), plus
how trustworthy the stream itself is (no source: FAILED; a fallback source:
SOURCE_FALLBACK warning; records lost: KMSG_GAP warning for `gap_hold_s`; a reader that
stopped reading: RESULT_STALE). With a state folder, the events that only a person's
release clears are kept across reboots (`xid_state`) and dropped at the next release
(`release(at)`, from the Kubernetes sink, or the folder's `released-at` file).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import CheckRun, Finding, Status
from gpuvigil.node import xid_feed, xid_state
from gpuvigil.node.catalog.xid import load_catalog
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.gpu.readings import (
    GpuInventory,
    GpuRef,
    GpuReset,
    GpuResets,
    KnownGpus,
    gpus_by_bus,
)
from gpuvigil.node.checks.kernel_log import kmsg_stream as ks
from gpuvigil.node.checks.kernel_log.kernel_log_sources import boot_info
from gpuvigil.node.checks.kernel_log.readings import Release
from gpuvigil.node.metrics import AgentMetrics
from gpuvigil.node.pipeline.judge import judge
from gpuvigil.node.scheduler import stale_finding

CHECK = ks.STREAM_CHECK  # "kernel_log": the stream replaces the one-shot check in the agent


class KernelStreamConfig(StrictModel):
    enabled: bool = Field(True, description="Follow the kernel log (Xid/SXid as they happen).")
    source: Literal["auto", "kmsg", "journal", "dmesg", "file"] = Field(
        "auto",
        description="auto tries /dev/kmsg, then dmesg polling, then journalctl polling, "
        "and reports a fallback as SOURCE_FALLBACK. `file` needs `file`.",
    )
    kmsg_path: Path = Field(Path("/dev/kmsg"), description="The kernel's record device.")
    file: Path | None = Field(
        None,
        description="Follow this plain file instead (`--kmsg-file`): for trying the "
        "agent anywhere and for tests. Lines appended later are read as they come.",
    )
    poll_interval_s: float = Field(
        0.5,
        gt=0,
        description="How often a polled source (file, journalctl, dmesg) is read, "
        "and the longest /dev/kmsg waits between liveness beats. 0.5 s keeps Xid-to-"
        "condition latency under 2 s at negligible CPU.",
    )
    poll_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Deadline of one journalctl/dmesg run; a hang is CHECK_TIMEOUT.",
    )
    gap_hold_s: float = Field(
        900.0,
        ge=0,
        description="How long a KMSG_GAP warning stays after records were lost: "
        "long enough for the controller and a person to see it (NVML's Xid events cover "
        "the gap meanwhile).",
    )


class KernelWatch:
    def __init__(
        self,
        config: KernelStreamConfig,
        *,
        ctx: CheckContext,
        changed: threading.Event,
        metrics: AgentMetrics | None,
        stale_factor: float = 2.0,
        state_dir: Path | None = None,
    ) -> None:
        self.config, self.ctx, self.changed, self.metrics = config, ctx, changed, metrics
        self.stale_factor = stale_factor
        self.health = ks.StreamHealth()
        self.started_at = datetime.now(UTC)
        env = ctx.env
        node_cfg = ctx.config
        boot_id, booted_at = boot_info(ctx)
        if booted_at is None:  # no /proc/stat below the root (a fake tree): this machine's
            booted_at = datetime.now(UTC) - timedelta(
                seconds=time.clock_gettime(time.CLOCK_BOOTTIME)
            )
        self.feed = xid_feed.XidFeed(
            load_catalog(getattr(node_cfg, "kernel_log", None)),
            check=CHECK,
            boot_id=boot_id,
            booted_at=booted_at,
        )
        self._gaps_counted = 0
        self.state = xid_state.XidState(state_dir) if state_dir is not None else None
        self._released_remote: datetime | None = None  # set by a sink's thread
        if self.state is not None:
            self.feed.remember(self.state.load())
            # Resets done earlier in this boot (by an agent since restarted) still count.
            kept = tuple(r for r in self.state.resets if boot_id and r.boot_id == boot_id)
            if kept:
                ctx.facts.put(GpuResets(kept))
        source = None
        if config.enabled:
            log_cfg = getattr(node_cfg, "kernel_log", None)
            source = ks.open_source(
                mode=config.source,
                kmsg_path=config.kmsg_path,
                file=config.file,
                poll_timeout_s=config.poll_timeout_s,
                env=env,
                health=self.health,
                max_bytes=getattr(log_cfg, "max_bytes", ks.DEFAULT_MAX_BYTES),
                missing_grace_s=max(5.0, 4 * config.poll_interval_s),
            )
        self.stream = ks.KmsgStream(
            source,
            on_records=self._on_records,
            health=self.health,
            poll_interval_s=config.poll_interval_s,
        )
        self.ready = threading.Event()  # the records since boot have been read
        if source is None:
            self.ready.set()

    def start(self) -> None:
        self.stream.start()

    def stop(self) -> None:
        self.stream.stop()

    def _gpu_map(self) -> dict[str, GpuRef]:
        facts = self.ctx.facts
        return gpus_by_bus(facts.get(GpuInventory), facts.get(KnownGpus))

    def _on_records(self, records: list[ks.Record], boot: bool) -> None:
        new = self.feed.add(records)
        if self.state is not None and new:
            self.state.add(self.feed.outliving_reboot(new, self._gpu_map()))
        if self.metrics is not None:
            for ev in new:
                if ev.kind == "sxid":
                    where = ev.device or ev.bus_id or "nvswitch"
                    self.metrics.sxid_events.labels(str(ev.code), where).inc()
                else:
                    ref = self._gpu_map().get(ev.bus_id or "")
                    gpu = str(ref.index) if ref else (ev.bus_id or ev.pci_bus_id or "unknown")
                    self.metrics.xid_events.labels(str(ev.code), gpu).inc()
            lost = self.health.gaps - self._gaps_counted
            if lost > 0:
                self.metrics.kmsg_gaps.inc(lost)
                self._gaps_counted = self.health.gaps
        source = self.stream.source
        if not (boot and source is not None and source.backlog_left):
            self.ready.set()  # the records since boot are all in (not just a batch of them)
        if new or boot:
            self.changed.set()

    def record_reset(self, reset: GpuReset) -> None:
        """A GPU reset succeeded (the remediator, on its thread): a fact of the `xid` rule
        from now on, kept in the state folder for the rest of this boot."""
        reset = dataclasses.replace(reset, boot_id=self.feed.boot_id or reset.boot_id)
        facts = self.ctx.facts
        facts.put((facts.get(GpuResets) or GpuResets()).with_(reset))
        if self.state is not None:
            self.state.add_reset(reset)
        self.changed.set()

    def release(self, at: datetime) -> None:
        """A person released the node at `at` (the Node annotation `RELEASED_ANNOTATION`,
        read by the Kubernetes sink on its thread); applied at the next snapshot."""
        if self._released_remote is None or at > self._released_remote:
            self._released_remote = at
            self.changed.set()

    def _released_at(self) -> datetime | None:
        if self.state is None:
            return self._released_remote
        marks = [
            self._released_remote,
            xid_state.read_release_marker(self.state.dir / xid_state.RELEASE_FILE),
        ]
        for at in sorted(m for m in marks if m is not None):
            self.state.release(at)
        return self.state.released_at

    def snapshot(self, now: float) -> tuple[list[Finding], list[CheckRun]]:
        if not self.config.enabled:
            return [], []
        h = self.health
        released_at = self._released_at()  # first: a release also ends a read warning
        out: list[Finding] = self.state.problems() if self.state is not None else []
        if self.stream.source is None:
            why = "; ".join(f"{s}: {r}" for s, r in h.fallback_from) or "disabled"
            out.append(
                Finding(
                    check=CHECK,
                    status=Status.FAILED,
                    code="DEPENDENCY_MISSING",
                    message=f"no kernel log source could be read ({why})",
                    evidence={"tried": [s for s, _ in h.fallback_from]},
                )
            )
        else:
            # The `gpu` check's inventory and NVML's own Xid events (its second source,
            # drained on every run) and the remediator's resets are in the node's facts.
            readings: list[object] = [self.feed.reading(h.source)]
            if released_at is not None:
                readings.append(Release(released_at))
            out.extend(
                judge(
                    readings,
                    config=self.ctx.config,
                    now=datetime.now(UTC),
                    check=CHECK,
                    facts=self.ctx.facts,
                )
            )
            if h.fallback_from and h.source in ("journal", "dmesg"):
                why = "; ".join(f"{s}: {r}" for s, r in h.fallback_from)
                out.append(
                    Finding(
                        check=CHECK,
                        status=Status.WARNING,
                        code="SOURCE_FALLBACK",
                        message=f"reading the kernel log with {h.source} polling ({why})",
                        evidence={"source": h.source, "failed": dict(h.fallback_from)},
                    )
                )
            if h.error is not None:
                out.append(h.error)
            rewound = [why for t, why in h.rewinds if now - t <= self.config.gap_hold_s]
            if rewound:
                out.append(
                    Finding(
                        check=CHECK,
                        status=Status.WARNING,
                        code="KMSG_GAP",
                        component="source:file",
                        message=f"the kernel log file was {rewound[-1]} and is read again from "
                        f"its start: lines written meanwhile may be missing "
                        f"({len(rewound)}x in the last {self.config.gap_hold_s:g} s)",
                        evidence={"why": rewound[-1], "times": len(rewound)},
                    )
                )
            recent = [n for t, n in h.gap_events if now - t <= self.config.gap_hold_s]
            if recent:
                out.append(
                    Finding(
                        check=CHECK,
                        status=Status.WARNING,
                        code="KMSG_GAP",
                        message=f"{sum(recent)} kernel log records lost to ring-buffer overruns "
                        f"in the last {self.config.gap_hold_s:g} s; Xid events may be missing",
                        evidence={
                            "lost": sum(recent),
                            "overruns": len(recent),
                            "lost_total": h.gaps,
                        },
                    )
                )
            limit = self.stale_factor * (self.config.poll_interval_s + self.config.poll_timeout_s)
            age = now - h.alive_at
            if age > limit:
                out.append(stale_finding(CHECK, age_s=age, limit_s=limit, last=out))
        run = CheckRun(
            check=CHECK,
            status=Status.worst(f.status for f in out),
            started_at=self.started_at,
            duration_s=0.0,
        )
        return out, [run]
