"""The kernel log's live sources for the kernel_log check: /dev/kmsg, dmesg, journalctl, a file.

Each reader returns the raw bytes it read (and the number of ring-buffer gaps) or raises
`SourceBroken` carrying the fail-closed finding that says why the source cannot be used
(the check then tries the next source). Tools run only through `io.exec.run`.
"""

from __future__ import annotations

import errno
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.io import exec as runner
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.config import KernelLogConfig

CHECK = "kernel_log"
DMESG_ARGV = ("dmesg", "--time-format", "iso")
JOURNAL_ARGV = ("journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short-iso-precise")
# A line of dmesg --time-format iso / journalctl short-iso-precise starts with this.
_ISO_LINE = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", re.MULTILINE)
KMSG_RECORD = re.compile(rb"^\d{1,3},\d{1,20},\d{1,20},[^;\n]{0,64};", re.MULTILINE)


class SourceBroken(Exception):
    """A source that cannot be used, with the finding that says why."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


def read_source(source: str, ctx: CheckContext, cfg: KernelLogConfig) -> tuple[bytes, int]:
    """Read one source: (bytes, gaps), or raise SourceBroken."""
    return _READERS[source](ctx, cfg)


# --- sources ------------------------------------------------------------------------------


def _read_kmsg(ctx: CheckContext, cfg: KernelLogConfig) -> tuple[bytes, int]:
    """Every record in the ring buffer now, without blocking: one record per read(2),
    EAGAIN at the end, EPIPE when records were overwritten while reading (a gap)."""
    path = ctx.path("dev/kmsg")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError as e:
        raise SourceBroken(failed("kmsg", "DEPENDENCY_MISSING", f"{path} does not exist")) from e
    except OSError as e:
        raise SourceBroken(
            failed("kmsg", "CHECK_ERROR", f"cannot open {path}: {e.strerror}")
        ) from e
    chunks: list[bytes] = []
    size, gaps = 0, 0
    deadline = time.monotonic() + cfg.timeout_s
    try:
        while size < cfg.max_bytes:
            if time.monotonic() > deadline:
                raise SourceBroken(
                    failed("kmsg", "CHECK_TIMEOUT", f"reading {path} took over {cfg.timeout_s} s")
                )
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break  # EAGAIN: read everything there is
            except OSError as e:
                if e.errno == errno.EPIPE:
                    gaps += 1
                    continue
                raise SourceBroken(
                    failed("kmsg", "CHECK_ERROR", f"reading {path}: {e.strerror}")
                ) from e
            if not chunk:
                break  # a regular file (a capture): end of file
            chunks.append(chunk if chunk.endswith(b"\n") else chunk + b"\n")
            size += len(chunk)
    finally:
        os.close(fd)
    if size >= cfg.max_bytes:  # stopped before the newest records: that is not a read
        raise SourceBroken(
            failed("kmsg", "CHECK_ERROR", f"{path} holds more than {cfg.max_bytes} bytes")
        )
    data = b"".join(chunks)
    if not data.strip():
        raise SourceBroken(failed("kmsg", "CHECK_ERROR", f"{path} gave no records"))
    if not KMSG_RECORD.search(data[:65536]):
        raise SourceBroken(
            failed(
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
        raise SourceBroken(bad)
    if res.truncated:  # the newest lines are the ones cut off: that is not a read
        raise SourceBroken(
            failed(
                source,
                "CHECK_ERROR",
                f"{argv[0]} printed more than {cfg.max_bytes} bytes",
                **res.evidence(),
            )
        )
    if not res.stdout.strip():
        # The kernel logs hundreds of lines at every boot: nothing at all means this tool
        # does not see the kernel log (a container's journal, dmesg -C), not "no Xid".
        raise SourceBroken(
            failed(
                source,
                "CHECK_ERROR",
                f"{argv[0]} printed no kernel messages for this boot",
                **res.evidence(),
            )
        )
    if not _ISO_LINE.search(res.stdout[:65536]):
        raise SourceBroken(
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
        raise SourceBroken(failed("file", "DEPENDENCY_MISSING", f"{path} does not exist")) from e
    except OSError as e:
        raise SourceBroken(
            failed("file", "CHECK_ERROR", f"cannot read {path}: {e.strerror}")
        ) from e
    if start:
        data = data[data.find(b"\n") + 1 :]
    return data, 0


_READERS = {"kmsg": _read_kmsg, "dmesg": _read_dmesg, "journal": _read_journal, "file": _read_file}


def boot_info(ctx: CheckContext) -> tuple[str | None, datetime | None]:
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


def failed(source: str, code: str, message: str, **evidence: Any) -> Finding:
    return Finding(
        check=CHECK,
        status=Status.FAILED,
        code=code,
        component=f"source:{source}",
        message=f"kernel log source {source}: {message}",
        action=Action.NONE,
        evidence={"source": source, **evidence},
    )
