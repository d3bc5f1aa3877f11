"""Probe: the kernel log as a source of Xid/SXid events (the `kernel_log` check).

The parser lives beside it in `kernel_log_parser` (pure); its entry points are
re-exported here for callers that think of "the kernel log probe".
"""

from __future__ import annotations

from gpuvigil.node.probes.kernel_log_parser import (
    parse_kmsg_record,
    parse_line,
    scan_bytes,
)

__all__ = ["parse_kmsg_record", "parse_line", "scan_bytes"]
