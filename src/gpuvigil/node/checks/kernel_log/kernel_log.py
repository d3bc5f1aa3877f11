"""Probe: the kernel log as a source of Xid/SXid events (the `kernel_log` check).

Reads the current boot's kernel log once - a non-blocking read of /dev/kmsg, `dmesg`, or
`journalctl -k` (in the order `node.kernel_log.sources` gives), or one configured file -
into a `KernelLog` reading, which the pipeline's `xid` rule judges with the node's other
facts (the GPU inventory for the GPU map, NVML's own Xid events, the remediator's GPU
resets, a person's release). A source that is missing, hangs, crashes or prints garbage
is skipped for the next one with a SOURCE_FALLBACK warning that says which source broke
and how; when every source fails the check fails closed with each source's own finding.

Called by `gpuvigil check`, the agent when its stream is off, and preflight (through the
registry); `analyze_capture` (a capture in memory, through `kernel_log_capture`) by tests
and tools. The agent's streaming follower of /dev/kmsg uses the parser beside this module
(`kernel_log_parser.parse_kmsg_record`).
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

from gpuvigil.core.findings import Finding, Status, utcnow
from gpuvigil.node.checks import CheckContext, Readout, check
from gpuvigil.node.checks.gpu.readings import GpuRef
from gpuvigil.node.checks.kernel_log import kernel_faults, kernel_log_capture
from gpuvigil.node.checks.kernel_log.kernel_log_parser import (
    driver_load_stamp,
    event_lines,
    fix_year,
    kmsg_records,
    parse_kmsg_record,
    parse_line,
    scan_bytes,
    with_wall_time,
)
from gpuvigil.node.checks.kernel_log.kernel_log_sources import (
    CHECK,
    SourceBroken,
    boot_info,
    read_source,
)
from gpuvigil.node.checks.kernel_log.log_lines import find_lines
from gpuvigil.node.checks.kernel_log.readings import KernelLog, XidEvent
from gpuvigil.node.config import KernelLogConfig

__all__ = [
    "analyze_capture",
    "boot_info",
    "parse_kmsg_record",
    "parse_line",
    "read_kernel_log",
    "scan_bytes",
]


@dataclass(frozen=True)
class SourceFailure:
    """Why one source could not be used: its finding (FAILED, a could-not-run code)."""

    source: str
    finding: Finding


@check(
    CHECK,
    group="fast",
    interval_s=60,
    # Two tools at node.kernel_log.timeout_s (10 s) each plus a bounded /dev/kmsg read.
    timeout_s=60,
    description="Xid/SXid events in the kernel log (/dev/kmsg, dmesg, journalctl or a file)",
)
def kernel_log_check(ctx: CheckContext) -> Readout:
    cfg = _config(ctx)
    now = utcnow()
    log, failures = read_kernel_log(ctx, cfg=cfg, now=now)
    if log is None:
        return Readout(findings=tuple(f.finding for f in failures))
    findings: list[Finding] = []
    if failures:
        findings.append(_fallback_finding(log, failures))
    if log.gaps:
        findings.append(
            Finding(
                check=CHECK,
                status=Status.WARNING,
                code="KMSG_GAP",
                message=f"{log.gaps} kernel log record(s) were overwritten before they were "
                "read: Xid events may be missing",
                evidence={"gaps": log.gaps, "source": log.source},
            )
        )
    return Readout((log,), tuple(findings))


def _config(ctx: CheckContext) -> KernelLogConfig:
    node = ctx.config
    cfg = getattr(node, "kernel_log", None)
    return cfg if isinstance(cfg, KernelLogConfig) else KernelLogConfig()


def read_kernel_log(
    ctx: CheckContext, *, cfg: KernelLogConfig, now: datetime
) -> tuple[KernelLog | None, list[SourceFailure]]:
    """The first source that works, and the failures of those tried before it."""
    boot_id, booted_at = boot_info(ctx)
    sources = ("file",) if cfg.file else cfg.sources
    failures: list[SourceFailure] = []
    for source in sources:
        try:
            data, gaps = read_source(source, ctx, cfg)
        except SourceBroken as e:
            failures.append(SourceFailure(source, e.finding))
            continue
        log = _reading(
            data, source, boot_id=boot_id, booted_at=booted_at, gaps=gaps, now=now, tz=zone_of(cfg)
        )
        fallback = tuple((f.source, f.finding.message) for f in failures)
        return replace(log, fallback_from=fallback), failures
    return None, failures


def analyze_capture(
    data: bytes,
    *,
    cfg: KernelLogConfig | None = None,
    gpus: Mapping[str, GpuRef] | None = None,
    now: datetime | None = None,
    year: int | None = None,
) -> list[Finding]:
    """Findings for a captured kernel log held in memory (`kernel_log_capture` reads the
    same from a stream): judged as of the capture's end unless `now` is given, so a
    post-mortem of an old capture shows what was active when it was taken. A capture has
    no boot id; the driver loads it records still clear reset-class events."""
    cfg = cfg or KernelLogConfig()
    return kernel_log_capture.analyze_stream(
        io.BytesIO(data), cfg=cfg, gpus=gpus, now=now, year=year, tz=zone_of(cfg)
    )


# --- the reading --------------------------------------------------------------------------


def _reading(
    data: bytes,
    source: str,
    *,
    boot_id: str | None,
    booted_at: datetime | None,
    gaps: int,
    now: datetime,
    tz: tzinfo = UTC,
    year: int | None = None,
) -> KernelLog:
    live = source != "file"  # kmsg/dmesg/journal -b read this boot only
    events: list[XidEvent]
    if source == "kmsg":
        events = [
            ev
            for rec in kmsg_records(b"\n".join(event_lines(data)))
            if (ev := parse_kmsg_record(rec)) is not None
        ]
    else:
        year = year or now.year
        events = scan_bytes(data, source=source, year=year, tz=tz)  # type: ignore[arg-type]
        events = [fix_year(ev, now) for ev in events]
    events = with_wall_time(events, booted_at if live else None)
    if live and boot_id:
        events = [ev.with_(boot_id=boot_id) for ev in events]
    return KernelLog(
        events=tuple(events),
        source=source,  # type: ignore[arg-type]
        boot_id=boot_id,
        booted_at=booted_at,
        driver_loaded_at=_driver_loaded_at(
            data, source, booted_at if live else None, year or now.year, tz
        ),
        gaps=gaps,
        lines_read=data.count(b"\n"),
        faults=tuple(
            kernel_faults.scan_faults(
                [raw.decode("utf-8", "replace") for raw in find_lines(data, kernel_faults.NEEDLES)],
                tz=tz,
                year=year or now.year,
            )
        ),
    )


def zone_of(cfg: KernelLogConfig) -> tzinfo:
    """The zone of stamps printed without an offset: configured, else this node's."""
    if cfg.timezone:
        return ZoneInfo(cfg.timezone)
    return datetime.now().astimezone().tzinfo or UTC


def _driver_loaded_at(
    data: bytes, source: str, booted_at: datetime | None, year: int, tz: tzinfo
) -> datetime | None:
    latest = None
    for raw in event_lines(data, b"NVRM: loading NVIDIA UNIX"):
        if source == "kmsg":
            head = raw.split(b";", 1)[0].split(b",")
            usec = int(head[2]) if len(head) > 2 and head[2].isdigit() else None
            ok = booted_at is not None and usec is not None
            when = booted_at + timedelta(microseconds=usec) if ok else None  # type: ignore[operator]
        else:
            stamp = driver_load_stamp(raw.decode("utf-8", "replace"), year=year, tz=tz)
            when = stamp.time if stamp else None
            if when is None and stamp and stamp.uptime_s is not None and booted_at:
                when = booted_at + timedelta(seconds=stamp.uptime_s)
        if when is not None and (latest is None or when > latest):
            latest = when
    return latest


# --- findings about the sources -----------------------------------------------------------


def _fallback_finding(log: KernelLog, failures: list[SourceFailure]) -> Finding:
    broken = ", ".join(f"{f.source} ({f.finding.code}: {f.finding.message})" for f in failures)
    return Finding(
        check=CHECK,
        status=Status.WARNING,
        code="SOURCE_FALLBACK",
        component="node",
        message=f"read the kernel log from {log.source} because {broken}",
        evidence={
            "used": log.source,
            "broken": [
                {
                    "source": f.source,
                    "code": f.finding.code,
                    "message": f.finding.message,
                    **f.finding.evidence,
                }
                for f in failures
            ],
        },
    )
