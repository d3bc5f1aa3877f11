"""Pure: one entry per real Xid event, from events that several sources reported.

Called by `rules.xid.evaluate` before it counts anything. NVML's Xid event stream and
the kernel log report the same faults; the kernel log may be read from two sources (kmsg
and the journal) or twice. One event seen twice must be one event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuvigil.node.checks.kernel_log.readings import XidEvent

MATCH_S = 10.0  # NVML delivers an event within seconds of the driver printing it
SAME_LINE_S = 1.0  # journal and kmsg stamps of one line differ by clock rounding only


@dataclass
class Seen:
    """One reconciled event and the sources that reported it."""

    event: XidEvent
    sources: set[str] = field(default_factory=set)


def reconcile(
    events: Iterable[XidEvent], *, match_s: float = MATCH_S, same_line_s: float = SAME_LINE_S
) -> list[Seen]:
    """One entry per real event: the same kernel line read twice (or from two sources,
    whose stamps differ by rounding) counts once, and NVML events are merged into the
    kernel-log event they report."""
    kernel: list[Seen] = []
    by_text: dict[tuple[Any, ...], _Same] = {}
    nvml: list[XidEvent] = []
    for ev in events:
        if ev.source == "nvml":
            nvml.append(ev)
            continue
        key = (ev.kind, ev.code, ev.bus_id or ev.pci_bus_id, ev.device, ev.message)
        same = by_text.get(key)
        if same is None:
            same = by_text[key] = _Same(ev.source)
        hit = same.find(ev, same_line_s)
        if hit is not None:
            hit.sources.add(ev.source)
            continue
        s = Seen(ev, {ev.source})
        same.add(s)
        kernel.append(s)
    matched: set[int] = set()
    for ev in nvml:
        twin = _twin(ev, kernel, matched, match_s)
        if twin is None:
            kernel.append(Seen(ev, {"nvml"}))
        else:
            matched.add(id(twin))
            twin.sources.add("nvml")
    return kernel


WINDOW = 64  # a line is looked for among the latest entries of its text only


class _Same:
    """The entries of one text (kind, code, bus, device, message), for `reconcile`. While
    every entry was reported by one source alone and `ev` comes from it too, "the same
    line again" is an identical instant (`_same_instant`), so the latest entry of that
    instant is looked up instead of compared with each of the last WINDOW (a hit adds
    no source then: every entry keeps one). An Xid storm repeats one text thousands of
    times (22,800 events compared 31 times each took 0.5 s). An event from any other
    source sends the text back to the comparisons, for good."""

    def __init__(self, source: str) -> None:
        self.entries: list[Seen] = []
        self.only: str | None = source  # the one source of every entry; None: mixed
        self.at: dict[Any, int] = {}  # instant -> index of its latest entry (while `only`)

    def find(self, ev: XidEvent, same_line_s: float) -> Seen | None:
        entries = self.entries
        if self.only is not None and ev.source == self.only:
            i = self.at.get(_instant(ev))
            return entries[i] if i is not None and i >= len(entries) - WINDOW else None
        self.only = None  # a second source: compare, as for every mixed text
        return next(
            (s for s in reversed(entries[-WINDOW:]) if _same_instant(s, ev, same_line_s)), None
        )

    def add(self, s: Seen) -> None:
        if self.only is not None:
            self.at[_instant(s.event)] = len(self.entries)
        self.entries.append(s)


def _same_instant(s: Seen, ev: XidEvent, tolerance_s: float) -> bool:
    """The same line again: identical stamp from one source, or stamps within rounding
    of each other when two different sources printed it."""
    k = s.event
    if ev.source in s.sources:
        return _instant(k) == _instant(ev)
    if k.time is not None and ev.time is not None:
        return abs((k.time - ev.time).total_seconds()) <= tolerance_s
    if k.seq is not None and ev.seq is not None:
        return k.seq == ev.seq
    return _instant(k) == _instant(ev)


def _instant(ev: XidEvent) -> Any:
    if ev.time is not None:
        return ev.time
    if ev.uptime_s is not None:
        return (ev.boot_id, ev.uptime_s)
    return (ev.seq, ev.timestamp, ev.line)  # no time: only an identical record matches


def _twin(ev: XidEvent, pool: list[Seen], taken: set[int], match_s: float) -> Seen | None:
    best, best_dt = None, None
    for s in pool:
        k = s.event
        if id(s) in taken or "nvml" in s.sources:
            continue
        if (k.kind, k.code) != (ev.kind, ev.code) or (k.bus_id or k.pci_bus_id) != (
            ev.bus_id or ev.pci_bus_id
        ):
            continue
        if ev.time is None or k.time is None:
            dt = match_s  # no clock to compare: same code on the same GPU is the best guess
        else:
            dt = abs((k.time - ev.time).total_seconds())
            if dt > match_s:
                continue
        if best_dt is None or dt < best_dt:
            best, best_dt = s, dt
    return best
