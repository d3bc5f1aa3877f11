"""Both Xid sources of the agent, collected for the layer-1 Xid rules.

Called by `kernel_watch`. `XidFeed` parses the kernel-log stream's records with the
layer-1 parser and keeps a bounded window of events; `NvmlXidPoller` drains NVML's own
Xid event set (through the NVML worker process, so a wedged driver cannot hang the agent)
into the same feed. `findings` hands all of it to `node.rules.xid.evaluate`, which applies
the catalog's boot-noise rules (driver load time, event times) to the records read at
start and reconciles the kernel-log and NVML copies of one event.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from gpuvigil.core.findings import Finding, utcnow
from gpuvigil.node.catalog.xid import XidCatalog, family_key
from gpuvigil.node.probes import kernel_log_parser as parser
from gpuvigil.node.probes.kmsg_stream import Record
from gpuvigil.node.readings import GpuInventory, GpuRef, XidEvent, XidSource, normalize_bus_id
from gpuvigil.node.rules import xid as xid_rules

log = logging.getLogger("gpuvigil.agent.xid")
MAX_EVENTS = 4096  # an Xid storm must not grow memory without bound; the newest are kept
_SOURCES: dict[str, XidSource] = {
    "kmsg": "kmsg", "dmesg": "dmesg", "journal": "journal", "file": "file", "nvml": "nvml"}


class XidFeed:
    def __init__(self, catalog: XidCatalog, *, check: str, boot_id: str | None = None,
                 booted_at: datetime | None = None) -> None:
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

    def add_events(self, events: Iterable[XidEvent]) -> None:
        """Events from NVML's event set, for reconciliation with the kernel log's."""
        with self._lock:
            self.events.extend(events)

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

    def findings(self, now: datetime, *, gpus: Mapping[str, GpuRef] | None = None
                 ) -> list[Finding]:
        with self._lock:
            events = list(self.events)
        return xid_rules.evaluate(events, catalog=self.catalog, now=now, gpus=gpus,
                                  boot_id=self.boot_id, driver_loaded_at=self.driver_loaded_at,
                                  check=self.check)


def gpu_map(inventory: object) -> dict[str, GpuRef]:
    """Normalized bus id -> GpuRef from the `gpu` check's latest inventory (if any)."""
    if not isinstance(inventory, GpuInventory):
        return {}
    out = {}
    for g in inventory.gpus:
        bus = normalize_bus_id(g.pci_bus_id or "")
        if bus is not None:
            out[bus] = GpuRef(index=g.index, bus_id=bus, family=family_key(g.architecture),
                              uuid=g.uuid)
    return out


def nvml_events(lines: list[dict[str, object]], *, now: datetime,
                boot_id: str | None) -> list[XidEvent]:
    """The NVML worker's `events` answer -> XidEvents with source "nvml". Never raises."""
    out = []
    for line in lines:
        for raw in line.get("events", []) if isinstance(line.get("events"), list) else []:
            if not isinstance(raw, dict) or not isinstance(raw.get("xid"), int):
                continue
            pci = raw.get("pci") if isinstance(raw.get("pci"), str) else ""
            out.append(XidEvent(kind="xid", code=raw["xid"], pci_bus_id=pci,
                                bus_id=normalize_bus_id(pci), message="", line="",
                                time=now, source="nvml", boot_id=boot_id))
    return out


class NvmlXidPoller:
    """Drains NVML Xid events every `interval_s` into the feed (own thread)."""

    def __init__(self, feed: XidFeed, *, module: str, env: dict[str, str], interval_s: float,
                 timeout_s: float, changed: threading.Event) -> None:
        self.feed, self.module, self.env = feed, module, env
        self.interval_s, self.timeout_s, self.changed = interval_s, timeout_s, changed
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="nvml-xid", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        from gpuvigil.node.probes import nvml

        wait = self.interval_s
        while not self._stop.wait(wait):
            client = nvml.client_for(self.module, self.env)
            answer = client.request({"op": "events", "timeout_ms": 0, "max_events": 1000},
                                    timeout_s=self.timeout_s)
            if answer.failure:
                # No NVML here, or it hung (the worker was killed): the `gpu` check reports
                # that; polling a node without NVML every few seconds would only burn CPU.
                wait = min(300.0, max(wait * 2, self.interval_s))
                continue
            wait = self.interval_s
            events = nvml_events(answer.lines, now=utcnow(), boot_id=self.feed.boot_id)
            if events:
                log.warning("NVML reported %d Xid event(s)", len(events))
                self.feed.add_events(events)
                self.changed.set()
