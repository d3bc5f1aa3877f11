"""The agent's memory of kernel-log events that outlive a reboot, in `agent.state_dir`.

Called by `kernel_watch`. The agent reads only the current boot's kernel log, but the Xid
rules keep a finding that calls for REPLACE or INVESTIGATE until a person releases the
node. Without this file, a reboot (by the controller's ladder, or by anyone) would erase
the evidence and the node would look healthy. So those events (`rules.xid.outlives_reboot`)
are written here with their boot ids, fed back into the rules at start, and dropped when
a person releases the node: a release marker newer than the event (`gpuvigil release`
writes the Node annotation `core.wire.RELEASED_ANNOTATION`; anywhere, a person can write
an ISO time into `<state_dir>/released-at`).

Fail closed, never crash: a state file that cannot be read or parsed is a WARNING finding
(`AGENT_STATE`, until the next release) and a fresh start; one that cannot be written is a
WARNING until a write succeeds. Writes are atomic (temporary file, fsync, rename). The file
is bounded: at most `MAX_EVENTS` events (the newest), lines cut to `MAX_LINE`, and a file
larger than `MAX_BYTES` is not read.

The same file keeps this boot's successful GPU resets (`GpuReset`, at most `MAX_RESETS`):
the kernel log is read again from the boot's start when the agent restarts, and without
them a reset-class Xid that a reset already cured would come back as FAILED.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuvigil.core.files import write_atomic
from gpuvigil.core.findings import Finding, Status
from gpuvigil.core.wire import decode_time
from gpuvigil.node.checks.gpu.readings import GpuReset
from gpuvigil.node.checks.kernel_log.readings import XidEvent

log = logging.getLogger("gpuvigil.agent.state")
EVENTS_FILE = "xid-events.json"
RELEASE_FILE = "released-at"
MAX_EVENTS = 256  # a person looks long before this many distinct REPLACE/INVESTIGATE events
MAX_LINE = 512  # characters kept of `line` and `message`
MAX_BYTES = 1 << 20  # 256 events of at most ~1.5 KB each fit well below this
MAX_RESETS = 64
CODE = "AGENT_STATE"
_FIELDS = {f.name for f in fields(XidEvent)}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "bus_id": str,
    "timestamp": str,
    "process": str,
    "device": str,
    "boot_id": str,
    "seq": int,
    "pid": int,
    "uptime_s": (int, float),
    "gpu_index": int,
}
_SOURCES = ("kmsg", "dmesg", "journal", "file", "nvml")


def encode_event(ev: XidEvent) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _FIELDS:
        v = getattr(ev, name)
        if v is None:
            continue
        if isinstance(v, datetime):
            v = v.isoformat()
        elif name in ("line", "message"):
            v = v[:MAX_LINE]
        out[name] = v
    return out


def decode_event(raw: object) -> XidEvent | None:
    """An event from its stored form; None for anything malformed (never raises)."""
    if not isinstance(raw, dict) or not set(raw) <= _FIELDS:
        return None
    kw = dict(raw)
    try:
        if kw.get("time") is not None:
            kw["time"] = datetime.fromisoformat(str(kw["time"]))
            if kw["time"].tzinfo is None:
                return None
        code = kw.get("code")
        if (
            not isinstance(code, int)
            or isinstance(code, bool)
            or kw.get("kind") not in ("xid", "sxid")
        ):
            return None
        for name in ("pci_bus_id", "message", "line"):
            if not isinstance(kw.get(name), str):
                return None
        for name, types in _OPTIONAL.items():
            v = kw.get(name)
            if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
                return None
        if kw.get("source", "file") not in _SOURCES:
            return None
        kw.setdefault("bus_id", None)
        return XidEvent(**kw)
    except (TypeError, ValueError):
        return None


def encode_reset(r: GpuReset) -> dict[str, Any]:
    return {"at": r.at.isoformat(), "gpus": list(r.gpus), "bus_ids": list(r.bus_ids),
            "boot_id": r.boot_id}  # fmt: skip


def decode_reset(raw: object) -> GpuReset | None:
    """A reset from its stored form; None for anything malformed (never raises)."""
    if not isinstance(raw, dict):
        return None
    at = decode_time(str(raw.get("at") or ""))
    gpus, bus_ids, boot = raw.get("gpus", []), raw.get("bus_ids", []), raw.get("boot_id")
    if at is None or not isinstance(gpus, list) or not isinstance(bus_ids, list):
        return None
    if not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
        return None
    if not all(isinstance(b, str) for b in bus_ids) or not isinstance(boot, str | None):
        return None
    return GpuReset(at=at, gpus=tuple(gpus), bus_ids=tuple(bus_ids), boot_id=boot)


def _key(ev: XidEvent) -> tuple[object, ...]:
    # The same record read again after an agent restart within one boot is the same event.
    return (ev.kind, ev.code, ev.pci_bus_id, ev.line[:MAX_LINE], ev.boot_id, ev.seq)


def read_release_marker(path: Path) -> datetime | None:
    """The time in a `released-at` file; None when absent or not an aware ISO time."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip()[:100]
    except OSError:
        return None
    return decode_time(text)


class XidState:
    """The persisted events of one node; thread-safe (the stream thread adds, the loop
    releases and reads)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / EVENTS_FILE
        self.events: list[XidEvent] = []
        self.resets: list[GpuReset] = []
        self.released_at: datetime | None = None  # the newest release applied
        self._read_problem: Finding | None = None
        self._write_problem: Finding | None = None
        self._lock = threading.Lock()

    def load(self) -> list[XidEvent]:
        """The events from the file; a missing file is a first start, not a problem."""
        try:
            if self.path.stat().st_size > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            doc = json.loads(self.path.read_bytes())
            if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
                raise ValueError("not a gpuvigil state file")
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError too
            self._read_problem = self._warning(
                f"cannot read {self.path} ({e}); started without the kernel-log events "
                "kept from earlier boots: a REPLACE/INVESTIGATE Xid logged before the last "
                "reboot may be missing from this report",
                error=str(e)[:200],
            )
            log.warning("%s", self._read_problem.message)
            return []
        events = [ev for ev in map(decode_event, doc["events"]) if ev is not None]
        raw_resets = doc.get("resets") if isinstance(doc.get("resets"), list) else []
        resets = [r for r in map(decode_reset, raw_resets) if r is not None]
        released = decode_time(str(doc.get("released_at") or ""))
        with self._lock:
            self.events = events[-MAX_EVENTS:]
            self.resets = resets[-MAX_RESETS:]
            self.released_at = released
            return list(self.events)

    def add_reset(self, reset: GpuReset) -> None:
        """Keep a successful GPU reset (only this boot's are kept: a reboot supersedes)."""
        with self._lock:
            same_boot = [r for r in self.resets if r.boot_id == reset.boot_id]
            self.resets = [*same_boot, reset][-MAX_RESETS:]
        self._save()

    def add(self, events: Iterable[XidEvent]) -> None:
        with self._lock:
            known = {_key(e) for e in self.events}
            new = [e for e in events if _key(e) not in known]
            if not new:
                return
            self.events = [*self.events, *new][-MAX_EVENTS:]
        self._save()

    def release(self, at: datetime) -> bool:
        """A person released the node at `at`: forget the events logged up to then.
        Returns False when this release (or a newer one) was already applied."""
        with self._lock:
            if self.released_at is not None and at <= self.released_at:
                return False
            self.released_at = at
            self.events = [e for e in self.events if e.time is not None and e.time > at]
            self._read_problem = None  # a person has looked at the node
        self._save()
        return True

    def problems(self) -> list[Finding]:
        return [f for f in (self._read_problem, self._write_problem) if f is not None]

    def _save(self) -> None:
        with self._lock:
            doc = {
                "v": 1,
                "released_at": self.released_at.isoformat() if self.released_at else None,
                "events": [encode_event(e) for e in self.events],
                "resets": [encode_reset(r) for r in self.resets],
            }
        try:
            write_atomic(self.path, json.dumps(doc, separators=(",", ":")).encode())
            self._write_problem = None
        except OSError as e:
            self._write_problem = self._warning(
                f"cannot write {self.path} ({e.strerror or e}); kernel-log events that call "
                "for a person would not survive a reboot",
                error=str(e)[:200],
            )
            log.warning("%s", self._write_problem.message)

    def _warning(self, message: str, **evidence: Any) -> Finding:
        return Finding(
            check="kernel_log",
            status=Status.WARNING,
            code=CODE,
            component=f"file:{self.path}",
            message=message,
            evidence={"path": str(self.path), **evidence},
        )
