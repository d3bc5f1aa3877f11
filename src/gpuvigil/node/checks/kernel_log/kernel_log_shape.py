"""Is a byte stream a kernel log at all? Pure: judges what the reader saw (`LineStats`).

An unreadable stream must not pass as a quiet log: an empty one, one that is mostly
control bytes (binary), or one where no line has a kernel-log prefix and nothing was
found is "could not tell". Shared by the capture reader (`analyze`, the check), `logscan`
and the kind detector of `analyze`; kept apart from the capture so that `logscan`
starts without the node config it needs.
"""

from __future__ import annotations

from gpuvigil.node.checks.kernel_log.kernel_log_parser import is_kmsg_record, parse_stamp
from gpuvigil.node.checks.kernel_log.log_lines import LineStats

_KERNELISH = ("kernel:", "NVRM:", "kern  :", "kern:")
MAX_BINARY_SHARE = 0.01  # more control bytes than this: not a text log


def unreadable(*, found: bool, stats: LineStats) -> str | None:
    """Why a stream in which `found` (anything a kernel log holds) is not a readable kernel
    log, or None when it is one."""
    if stats.bytes_read == 0 or not bytes(stats.sample).strip():
        return "the kernel log is empty"
    if stats.control_bytes > MAX_BINARY_SHARE * stats.bytes_read and not found:
        stopped = f"; stopped after {stats.bytes_read} bytes" if stats.gave_up else ""
        return f"this is not text ({stats.control_bytes} control bytes{stopped}): not a kernel log"
    if found:
        return None
    lines = [ln for ln in bytes(stats.sample).decode("utf-8", "replace").splitlines() if ln.strip()]
    if not any(looks_like_kernel_line(ln) for ln in lines[:200]):
        return "no line has a kernel log prefix or time stamp: not a kernel log"
    return None


def looks_like_kernel_line(line: str) -> bool:
    """A line with a time stamp a kernel log prints, a /dev/kmsg header, or a kernel tag."""
    head = line[:200]
    return (
        parse_stamp(line[:120]).text is not None
        or is_kmsg_record(line)
        or any(tag in head for tag in _KERNELISH)
    )
