"""The kernel-log stream's Xid/SXid events, collected for the layer-1 Xid rules.

Called by `kernel_watch`. `XidFeed` parses the stream's records with the layer-1 parser
and keeps a bounded window of events; `reading()` is that window as a KernelLog reading,
which `kernel_watch` hands to `node.pipeline` like any probe's reading: the `xid` rule
applies the catalog's boot-noise rules (driver load time, event times) to the records
read at start and reconciles the kernel-log and NVML copies of one event.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from gpuvigil.core.findings import utcnow
from gpuvigil.node.catalog.xid import XidCatalog
from gpuvigil.node.checks.gpu.readings import GpuRef
from gpuvigil.node.checks.kernel_log import kernel_log_parser as parser
from gpuvigil.node.checks.kernel_log.kmsg_stream import Record
from gpuvigil.node.checks.kernel_log.readings import KernelLog, XidEvent, XidSource
from gpuvigil.node.checks.kernel_log.rules import xid as xid_rules

MAX_EVENTS = 4096  # an Xid storm must not grow memory without bound; the newest are kept
_SOURCES: dict[str, XidSource] = {
    "kmsg": "kmsg",
    "dmesg": "dmesg",
    "journal": "journal",
    "file": "file",
    "nvml": "nvml",
}


class XidFeed:
    def __init__(
        self,
        catalog: XidCatalog,
        *,
        check: str,
        boot_id: str | None = None,
        booted_at: datetime | None = None,
    ) -> None:
        self.catalog, self.check = catalog, check
        self.boot_id, self.booted_at = boot_id, booted_at
        self.events: deque[XidEvent] = deque(maxlen=MAX_EVENTS)
        self.driver_loaded_at: datetime | None = None
        self.lines = 0
        self._lock = threading.Lock()

    def add(self, records: Iterable[Record]) -> list[XidEvent]:
        """Parse stream records; returns the new events (for metrics and logging)."""
        new: list[XidEvent] = []
        for rec in records:
            self.lines += 1
            if rec.source == "kmsg":
                ev = parser.parse_kmsg_record(rec.text)
            else:
                ev = parser.parse_line(rec.text, source=_SOURCES.get(rec.source, "file"))
            if ev is None:
                self._maybe_driver_load(rec.text)
                continue
            new.append(self._dated(ev))
        if new:
            with self._lock:
                self.events.extend(new)
        return new

    def _dated(self, ev: XidEvent) -> XidEvent:
        # The stream reads this boot's log: seconds-since-boot stamps get a wall time, and
        # events the boot id, which is how the rules tell a reboot cleared them.
        if ev.time is None and ev.uptime_s is not None and self.booted_at is not None:
            ev = ev.with_(time=self.booted_at + timedelta(seconds=ev.uptime_s))
        if ev.time is None:
            ev = ev.with_(time=utcnow())  # no stamp at all: it is being logged now
        return ev.with_(boot_id=self.boot_id) if self.boot_id else ev

    def _maybe_driver_load(self, text: str) -> None:
        stamp = parser.driver_load_stamp(text)
        if stamp is None:
            return
        when = stamp.time
        if when is None and stamp.uptime_s is not None and self.booted_at is not None:
            when = self.booted_at + timedelta(seconds=stamp.uptime_s)
        if when is not None and (self.driver_loaded_at is None or when > self.driver_loaded_at):
            self.driver_loaded_at = when

    def remember(self, events: Iterable[XidEvent]) -> None:
        """Events of earlier boots kept by the agent (`xid_state`), with their boot ids."""
        with self._lock:
            self.events.extendleft(reversed(list(events)))

    def outliving_reboot(
        self, events: Iterable[XidEvent], gpus: Mapping[str, GpuRef] | None = None
    ) -> list[XidEvent]:
        """The ones that only a person's release clears (worth keeping across a reboot)."""
        return [
            ev for ev in events if xid_rules.outlives_reboot(ev, catalog=self.catalog, gpus=gpus)
        ]

    def reading(self, source: str = "kmsg") -> KernelLog:
        """The events kept so far as one KernelLog reading of this boot."""
        with self._lock:
            events = tuple(self.events)
        return KernelLog(
            events=events,
            source=_SOURCES.get(source, "file"),
            boot_id=self.boot_id,
            booted_at=self.booted_at,
            driver_loaded_at=self.driver_loaded_at,
            lines_read=self.lines,
        )
