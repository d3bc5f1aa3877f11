"""Probe: the kernel log as a source of Xid/SXid events (the `kernel_log` check).

Reads the current boot's kernel log once - a non-blocking read of /dev/kmsg, `dmesg`, or
`journalctl -k` (in the order `node.kernel_log.sources` gives), or one configured file -
into a `KernelLog` reading, then hands it to the pure rules (`node.rules.xid`). A source
that is missing, hangs, crashes or prints garbage is skipped for the next one with a
SOURCE_FALLBACK warning that says which source broke and how; when every source fails the
check fails closed with each source's own finding.

Called by `gpuvigil check`, the agent's fast loop and preflight (through the registry).
The agent's streaming follower of /dev/kmsg uses the parser beside this module
(`kernel_log_parser.parse_kmsg_record`), re-exported here.

Seams in `CheckContext.extras` (set by whoever knows them; all optional):
`gpu_map` (normalized bus id -> GpuRef, from the GPU readings), `nvml_xid_events`
(XidEvents with source "nvml"), `gpu_resets` (bus id -> datetime of the last reset),
`released_at` (when a person last released the node).
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuvigil.core.findings import Action, Finding, Status, utcnow
from gpuvigil.node.catalog.xid import load_catalog
from gpuvigil.node.checks import CheckContext, check
from gpuvigil.node.config import KernelLogConfig
from gpuvigil.node.probes import exec as runner
from gpuvigil.node.probes.kernel_log_parser import (
    driver_load_stamp,
    event_lines,
    kmsg_records,
    parse_kmsg_record,
    parse_line,
    scan_bytes,
    with_wall_time,
)
from gpuvigil.node.readings import KernelLog, XidEvent
from gpuvigil.node.rules import xid as xid_rules

__all__ = ["parse_kmsg_record", "parse_line", "read_kernel_log", "scan_bytes"]

CHECK = "kernel_log"
DMESG_ARGV = ("dmesg", "--time-format", "iso")
JOURNAL_ARGV = ("journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short-iso-precise")
# A line of dmesg --time-format iso / journalctl short-iso-precise starts with this.
_ISO_LINE = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", re.MULTILINE)
_KMSG_RECORD = re.compile(rb"^\d{1,3},\d{1,20},\d{1,20},[^;\n]{0,64};", re.MULTILINE)


@dataclass(frozen=True)
class SourceFailure:
    """Why one source could not be used: its finding (FAILED, a could-not-run code)."""

    source: str
    finding: Finding


class _Broken(Exception):
    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


@check(
    CHECK,
    group="fast",
    interval_s=60,
    # Two tools at node.kernel_log.timeout_s (10 s) each plus a bounded /dev/kmsg read.
    timeout_s=60,
    description="Xid/SXid events in the kernel log (/dev/kmsg, dmesg, journalctl or a file)",
)
def kernel_log_check(ctx: CheckContext) -> list[Finding]:
    cfg = _config(ctx)
    now = utcnow()
    log, failures = read_kernel_log(ctx, cfg=cfg, now=now)
    if log is None:
        return [f.finding for f in failures]
    findings = xid_rules.evaluate_log(
        log,
        catalog=load_catalog(cfg),
        now=now,
        gpus=ctx.extras.get("gpu_map"),
        extra_events=tuple(ctx.extras.get("nvml_xid_events", ())),
        resets=ctx.extras.get("gpu_resets"),
        released_at=ctx.extras.get("released_at"),
        check=CHECK,
    )
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
    return findings


def _config(ctx: CheckContext) -> KernelLogConfig:
    node = ctx.config
    cfg = getattr(node, "kernel_log", None)
    return cfg if isinstance(cfg, KernelLogConfig) else KernelLogConfig()


def read_kernel_log(
    ctx: CheckContext, *, cfg: KernelLogConfig, now: datetime
) -> tuple[KernelLog | None, list[SourceFailure]]:
    """The first source that works, and the failures of those tried before it."""
    boot_id, booted_at = _boot(ctx)
    sources = ("file",) if cfg.file else cfg.sources
    failures: list[SourceFailure] = []
    for source in sources:
        try:
            data, gaps = _READERS[source](ctx, cfg)
        except _Broken as e:
            failures.append(SourceFailure(source, e.finding))
            continue
        log = _reading(data, source, boot_id=boot_id, booted_at=booted_at, gaps=gaps, now=now)
        fallback = tuple((f.source, f.finding.message) for f in failures)
        return _replace_fallback(log, fallback), failures
    return None, failures


def _replace_fallback(log: KernelLog, fallback: tuple[tuple[str, str], ...]) -> KernelLog:
    return KernelLog(
        events=log.events,
        source=log.source,
        boot_id=log.boot_id,
        booted_at=log.booted_at,
        driver_loaded_at=log.driver_loaded_at,
        gaps=log.gaps,
        lines_read=log.lines_read,
        fallback_from=fallback,
    )


# --- sources ------------------------------------------------------------------------------


def _read_kmsg(ctx: CheckContext, cfg: KernelLogConfig) -> tuple[bytes, int]:
    """Every record in the ring buffer now, without blocking: one record per read(2),
    EAGAIN at the end, EPIPE when records were overwritten while reading (a gap)."""
    path = ctx.path("dev/kmsg")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as e:
        raise _Broken(_failed("kmsg", "DEPENDENCY_MISSING", f"{path} does not exist")) from e
    except OSError as e:
        raise _Broken(_failed("kmsg", "CHECK_ERROR", f"cannot open {path}: {e.strerror}")) from e
    chunks: list[bytes] = []
    size, gaps = 0, 0
    deadline = time.monotonic() + cfg.timeout_s
    try:
        while size < cfg.max_bytes:
            if time.monotonic() > deadline:
                raise _Broken(
                    _failed("kmsg", "CHECK_TIMEOUT", f"reading {path} took over {cfg.timeout_s} s")
                )
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break  # EAGAIN: read everything there is
            except OSError as e:
                if e.errno == errno.EPIPE:
                    gaps += 1
                    continue
                raise _Broken(
                    _failed("kmsg", "CHECK_ERROR", f"reading {path}: {e.strerror}")
                ) from e
            if not chunk:
                break  # a regular file (a capture): end of file
            chunks.append(chunk if chunk.endswith(b"\n") else chunk + b"\n")
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data.strip():
        raise _Broken(_failed("kmsg", "CHECK_ERROR", f"{path} gave no records"))
    if not _KMSG_RECORD.search(data[:65536]):
        raise _Broken(
            _failed(
                "kmsg",
                "CHECK_ERROR",
                f"{path} gave data that is not kmsg records",
                head=data[:300].decode("utf-8", "replace"),
            )
        )
    return data, gaps


def _read_tool(
    source: str, argv: tuple[str, ...], ctx: CheckContext, cfg: KernelLogConfig
) -> tuple[bytes, int]:
    res = runner.run(argv, timeout_s=cfg.timeout_s, max_output=cfg.max_bytes, env=ctx.env)
    bad = runner.failure_finding(res, check=CHECK, component=f"source:{source}")
    if bad is not None:
        raise _Broken(bad)
    if res.truncated:  # the newest lines are the ones cut off: that is not a read
        raise _Broken(
            _failed(
                source,
                "CHECK_ERROR",
                f"{argv[0]} printed more than {cfg.max_bytes} bytes",
                **res.evidence(),
            )
        )
    if res.stdout.strip() and not _ISO_LINE.search(res.stdout[:65536]):
        raise _Broken(
            runner.unparsable_finding(
                res, check=CHECK, component=f"source:{source}", problem="no time-stamped lines"
            )
        )
    return res.stdout, 0


def _read_dmesg(ctx: CheckContext, cfg: KernelLogConfig) -> tuple[bytes, int]:
    return _read_tool("dmesg", DMESG_ARGV, ctx, cfg)


def _read_journal(ctx: CheckContext, cfg: KernelLogConfig) -> tuple[bytes, int]:
    return _read_tool("journal", JOURNAL_ARGV, ctx, cfg)


def _read_file(ctx: CheckContext, cfg: KernelLogConfig) -> tuple[bytes, int]:
    """The configured file's last `max_bytes` (the newest lines), from a whole line on."""
    path = ctx.path(cfg.file or "")
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            start = max(0, size - cfg.max_bytes)
            f.seek(start)
            data = f.read(cfg.max_bytes)
    except FileNotFoundError as e:
        raise _Broken(_failed("file", "DEPENDENCY_MISSING", f"{path} does not exist")) from e
    except OSError as e:
        raise _Broken(_failed("file", "CHECK_ERROR", f"cannot read {path}: {e.strerror}")) from e
    if start:
        data = data[data.find(b"\n") + 1 :]
    return data, 0


_READERS = {"kmsg": _read_kmsg, "dmesg": _read_dmesg, "journal": _read_journal, "file": _read_file}


# --- the reading --------------------------------------------------------------------------


def _reading(
    data: bytes,
    source: str,
    *,
    boot_id: str | None,
    booted_at: datetime | None,
    gaps: int,
    now: datetime,
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
        events = scan_bytes(data, source=source, year=now.year)  # type: ignore[arg-type]
        events = [_fix_year(ev, now) for ev in events]
    events = with_wall_time(events, booted_at if live else None)
    if live and boot_id:
        events = [ev.with_(boot_id=boot_id) for ev in events]
    return KernelLog(
        events=tuple(events),
        source=source,  # type: ignore[arg-type]
        boot_id=boot_id,
        booted_at=booted_at,
        driver_loaded_at=_driver_loaded_at(data, source, booted_at if live else None, now),
        gaps=gaps,
        lines_read=data.count(b"\n"),
    )


def _fix_year(ev: XidEvent, now: datetime) -> XidEvent:
    """Syslog stamps have no year: one that lands in the future is from last year."""
    if (
        ev.time is not None
        and ev.time > now + timedelta(days=1)
        and ev.timestamp
        and (ev.timestamp[:1].isalpha())
    ):
        try:
            return ev.with_(time=ev.time.replace(year=ev.time.year - 1))
        except ValueError:  # Feb 29
            return ev
    return ev


def _driver_loaded_at(
    data: bytes, source: str, booted_at: datetime | None, now: datetime
) -> datetime | None:
    latest = None
    for raw in event_lines(data, b"NVRM: loading NVIDIA UNIX"):
        if source == "kmsg":
            head = raw.split(b";", 1)[0].split(b",")
            usec = int(head[2]) if len(head) > 2 and head[2].isdigit() else None
            ok = booted_at is not None and usec is not None
            when = booted_at + timedelta(microseconds=usec) if ok else None  # type: ignore[operator]
        else:
            stamp = driver_load_stamp(raw.decode("utf-8", "replace"), year=now.year)
            when = stamp.time if stamp else None
            if when is None and stamp and stamp.uptime_s is not None and booted_at:
                when = booted_at + timedelta(seconds=stamp.uptime_s)
        if when is not None and (latest is None or when > latest):
            latest = when
    return latest


def _boot(ctx: CheckContext) -> tuple[str | None, datetime | None]:
    boot_id = _read_text(ctx.path("proc/sys/kernel/random/boot_id"))
    booted_at = None
    stat = _read_text(ctx.path("proc/stat")) or ""
    for line in stat.splitlines():
        if line.startswith("btime "):
            try:
                booted_at = datetime.fromtimestamp(int(line.split()[1]), tz=UTC)
            except (ValueError, IndexError, OverflowError):
                booted_at = None
    return (boot_id.strip() or None) if boot_id else None, booted_at


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


# --- findings about the sources -----------------------------------------------------------


def _failed(source: str, code: str, message: str, **evidence: Any) -> Finding:
    return Finding(
        check=CHECK,
        status=Status.FAILED,
        code=code,
        component=f"source:{source}",
        message=f"kernel log source {source}: {message}",
        action=Action.NONE,
        evidence={"source": source, **evidence},
    )


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
