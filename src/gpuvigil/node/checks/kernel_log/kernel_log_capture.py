"""A captured kernel log (a file, a pipe, a support bundle's dmesg) read as one stream ->
the KernelLog reading, judged by `node.pipeline` as of the capture's end. I/O-free: it
reads what it is given.

One pass in chunks (`log_lines`), so a 200 MB log costs a chunk of memory, not 200 MB.
What it keeps: every Xid/SXid event, the latest driver load, the GPU failures logged
without an Xid (`kernel_faults`), the last line's time stamp (the capture's end).

Not every byte stream is a kernel log, and an unreadable one must not pass as a quiet
one: an empty capture, one that is mostly control bytes (binary), or one where no line
has a kernel-log prefix and nothing was found is "could not tell" (CHECK_ERROR), and a
capture cut at the size cap is judged but also says it could not read the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo
from functools import cache
from typing import BinaryIO

from gpuvigil.core.findings import Finding, Status, utcnow
from gpuvigil.node.catalog import phrases
from gpuvigil.node.checks.gpu.readings import GpuRef, KnownGpus
from gpuvigil.node.checks.kernel_log import kernel_faults
from gpuvigil.node.checks.kernel_log.grep_lines import GrepLines
from gpuvigil.node.checks.kernel_log.kernel_log_parser import (
    driver_load_stamp,
    fix_year,
    parse_line,
    stamp_before,
)
from gpuvigil.node.checks.kernel_log.kernel_log_shape import unreadable
from gpuvigil.node.checks.kernel_log.log_lines import LineStats, iter_lines
from gpuvigil.node.checks.kernel_log.readings import KernelLog, XidEvent
from gpuvigil.node.config import KernelLogConfig

CHECK = "kernel_log"
_XID = b"Xid ("
_LOAD = b"NVRM: loading NVIDIA UNIX"
_NEEDLES = (_XID, _LOAD, *kernel_faults.NEEDLES)
# A stream that is mostly control bytes this far in, with nothing found, is binary: stop.
GIVE_UP_BINARY = 64 * 1024 * 1024


def needles() -> tuple[bytes, ...]:
    """Every marker a kernel log is scanned for, each once: the Xid line, the driver
    load, the GPU failures of `kernel_faults`, and every error phrase's own text
    (`catalog/phrases.yaml`). Texts, not the phrases' anchors: an anchor (`NVRM:`) is on
    many lines that hold nothing, and each such line cost a decode and 36 phrase tests
    (analyze ran at 1/5 of logscan's speed); a needle costs one C-level `bytes.find`
    pass over each chunk and finds only the lines that matter."""
    every = tuple(dict.fromkeys((*_NEEDLES, *phrases.load().log_needles())))
    # A needle holding another is redundant: every line with it is found by the shorter.
    return tuple(n for n in every if not any(m != n and m in n for m in every))


@cache
def _phrase_lines() -> tuple[bytes, ...]:
    """The lines a phrase counts on in a kernel log: those holding an anchor or one of the
    reader's own needles (a tool's words count where the driver logged them)."""
    return tuple(dict.fromkeys((*_NEEDLES, *phrases.load().log_anchors())))


@dataclass(frozen=True)
class Capture:
    log: KernelLog
    end: datetime | None  # the last time stamp seen (the capture's end)
    stats: LineStats
    unreadable: str | None  # why this is not a kernel log that could be read, else None
    phrases: tuple[phrases.Hit, ...] = ()  # the error phrases seen (capture.error_text)


def read_capture(
    stream: BinaryIO,
    *,
    tz: tzinfo,
    now: datetime,
    year: int | None = None,
    max_bytes: int | None = None,
    chunk_size: int | None = None,
    stop_on: tuple[type[Exception], ...] = (),
) -> Capture:
    """`stop_on`: errors of `stream` (its deadline) that end the read with what was read
    so far kept and judged, as at the size cap (a failure already seen still counts),
    the rest being "could not tell". Raised as before when nothing was read."""
    stats = LineStats()
    year = year or now.year
    events: list[XidEvent] = []
    loaded: datetime | None = None
    faults = kernel_faults.FaultScanner(tz=tz, year=year)
    said = phrases.HitCounter(phrases.load())
    kw = {"chunk_size": chunk_size} if chunk_size else {}
    marks = needles()
    grep = GrepLines(marks)  # one grep for the whole stream, ended below
    lines = iter_lines(stream, marks, max_bytes=max_bytes, stats=stats, give_up=GIVE_UP_BINARY,
                       find=grep, **kw)  # fmt: skip
    anchors = _phrase_lines()
    try:
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            xid = _XID in raw  # an anchor too: most found lines, in an Xid storm
            if xid or any(a in raw for a in anchors):  # on a found line only
                said.feed(line)
            if xid:
                ev = parse_line(line, source="file", tz=tz, year=year)
                if ev is not None:
                    events.append(fix_year(ev, now))
            if _LOAD in raw:
                stamp = driver_load_stamp(line, tz=tz, year=year)
                if (
                    stamp is not None
                    and stamp.time is not None
                    and (loaded is None or stamp.time > loaded)
                ):
                    loaded = stamp.time
            faults.feed(line)
    except stop_on as e:
        if not stats.bytes_read:
            raise
        stats.stopped = str(e)
    finally:
        grep.close()
    times = [ev.time for ev in events if ev.time is not None]
    last = stats.last_line.decode("utf-8", errors="replace")
    end = stamp_before(last, len(last), tz=tz, year=year).time if last else None
    if end is not None:
        times.append(end)
    log = KernelLog(
        events=tuple(events),
        source="file",
        driver_loaded_at=loaded,
        lines_read=stats.lines,
        faults=tuple(faults.faults),
    )
    found = bool(log.events or log.faults or log.driver_loaded_at)
    return Capture(
        log,
        max(times) if times else None,
        stats,
        unreadable(found=found, stats=stats),
        said.hits(),
    )


def judge(
    capture: Capture,
    *,
    cfg: KernelLogConfig,
    gpus: Mapping[str, GpuRef] | None = None,
    now: datetime | None = None,
) -> list[Finding]:
    """The pipeline's kernel-log rules (`xid`, `driver_faults`) as of `now` (default: the
    capture's end), plus "could not tell" for a capture that was not a readable kernel log
    or was cut. `gpus`: the GPUs the bundle's GPU readings named, by bus id."""
    # Imported here: `logscan` reads captures through this module and never judges them.
    from gpuvigil.node.config import NodeConfig
    from gpuvigil.node.pipeline.judge import judge as pipeline_judge

    end = now or capture.end or utcnow()
    readings: list[object] = [capture.log]
    if gpus:
        readings.append(KnownGpus(dict(gpus)))
    out = pipeline_judge(readings, config=NodeConfig(kernel_log=cfg), now=end, check=CHECK)
    stats = capture.stats
    if capture.unreadable:
        out.append(_could_not_tell(capture.unreadable, stats))
    if stats.stopped:
        out.append(
            _could_not_tell(
                f"only the first {stats.bytes_read} bytes were read ({stats.stopped}): "
                "events after them are unknown",
                stats,
            )
        )
    if stats.truncated:
        out.append(
            _could_not_tell(
                f"only the first {stats.bytes_read} bytes were read (the size cap): "
                "events after them are unknown",
                stats,
            )
        )
    return out


def analyze_stream(
    stream: BinaryIO,
    *,
    cfg: KernelLogConfig | None = None,
    gpus: Mapping[str, GpuRef] | None = None,
    now: datetime | None = None,
    year: int | None = None,
    tz: tzinfo,
    max_bytes: int | None = None,
) -> list[Finding]:
    cfg = cfg or KernelLogConfig()
    capture = read_capture(stream, tz=tz, now=now or utcnow(), year=year, max_bytes=max_bytes)
    return judge(capture, cfg=cfg, gpus=gpus, now=now)


def _could_not_tell(why: str, stats: LineStats) -> Finding:
    return Finding(
        check=CHECK,
        status=Status.FAILED,
        code="CHECK_ERROR",
        message=f"could not tell: {why}",
        evidence={
            "bytes_read": stats.bytes_read,
            "lines": stats.lines,
            "long_lines": stats.long_lines,
        },
    )
