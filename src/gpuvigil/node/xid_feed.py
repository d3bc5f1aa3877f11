"""Collects the Xid/SXid events of the kernel-log stream into a `KernelLog` reading.

Called by `kernel_watch` (records from the stream) and, for the second source, by the
NVML probe's event hook (`add_events`, source "nvml"). The layer-1 Xid rules turn the
reading into findings: they apply the catalog's boot-noise rules to the records read at
start (`boot=True`) and reconcile kernel-log and NVML copies of the same event. This
module only parses (with the layer-1 parser) and keeps a bounded window of events.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from gpuvigil.core.findings import Finding
from gpuvigil.node.probes import kernel_log_parser as parser
from gpuvigil.node.probes.kmsg_stream import Record
from gpuvigil.node.readings import KernelLog, XidEvent, XidSource

MAX_EVENTS = 4096  # an Xid storm must not grow memory without bound; the newest are kept

Rules = Callable[[KernelLog, datetime], list[Finding]]


@dataclass
class FeedState:
    driver_loaded_uptime_s: float | None = None
    source: str = "kmsg"
    gaps: int = 0
    lines: int = 0


class XidFeed:
    def __init__(self, rules: Rules | None = None, *, boot_id: str | None = None) -> None:
        self.rules = rules
        self.boot_id = boot_id
        self.events: deque[XidEvent] = deque(maxlen=MAX_EVENTS)
        self.boot_events = 0  # how many of the first events came from the boot backlog
        self.state = FeedState()
        self._lock = threading.Lock()

    def add(self, records: Iterable[Record], *, boot: bool) -> list[XidEvent]:
        """Parse records; returns the new events (for metrics)."""
        new: list[XidEvent] = []
        for rec in records:
            self.state.lines += 1
            if rec.source == "kmsg":
                ev = parser.parse_kmsg_record(rec.text, boot_id=self.boot_id)
            else:
                ev = parser.parse_line(rec.text, source=_source(rec.source))
            if ev is None:
                stamp = parser.driver_load_stamp(rec.text)
                if stamp is not None and stamp.uptime_s is not None:
                    self.state.driver_loaded_uptime_s = stamp.uptime_s
                continue
            new.append(ev)
        with self._lock:
            self.events.extend(new)
            if boot:
                self.boot_events += len(new)
        return new

    def add_events(self, events: Iterable[XidEvent]) -> None:
        """Events from another source (NVML's event set), for reconciliation."""
        with self._lock:
            self.events.extend(events)

    def reading(self, *, source: str, gaps: int) -> KernelLog:
        with self._lock:
            events = tuple(self.events)
        return KernelLog(events=events, source=_source(source), boot_id=self.boot_id,
                         gaps=gaps, lines_read=self.state.lines)

    def findings(self, now: datetime, *, source: str = "kmsg", gaps: int = 0) -> list[Finding]:
        if self.rules is None:
            return []
        return self.rules(self.reading(source=source, gaps=gaps), now)


_SOURCES: dict[str, XidSource] = {
    "kmsg": "kmsg", "dmesg": "dmesg", "journal": "journal", "file": "file", "nvml": "nvml"}


def _source(name: str) -> XidSource:
    return _SOURCES.get(name, "file")
