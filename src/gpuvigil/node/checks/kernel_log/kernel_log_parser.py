"""Pure parser of kernel-log lines into Xid/SXid events. Never raises, never does I/O.

Called by the kernel_log check (a one-shot read of /dev/kmsg, dmesg, journalctl or a file),
by the agent's streaming /dev/kmsg follower (`parse_kmsg_record`), and by `gpuvigil
logscan` / `analyze` (`scan_bytes` / `iter_stream`, which skip the 99% of lines that are
not Xid lines with one substring search per chunk instead of one regex per line).

An event is a line where the driver printed `Xid (<PCI id>): <code>` (NVRM, GPU) or
`SXid (<PCI id>): <code>` (nvidia-nvswitchN, NVSwitch). References such as "caused by
previous Xid 149" or a `_kgspLogXid119` banner have no "(<PCI id>): <code>" and are not
events. Prefixes understood (see docs/kernel-log.md for one example each):

- raw dmesg / journalctl -o short-monotonic `[  123.456789]`, dmesg -r `<4>[ 123.45]`
- dmesg -T / --time-format ctime `[Mon Nov 30 07:31:02 2026]`
- dmesg -H / --time-format reltime `[Nov30 07:31]` then `[  +0.000004]` (the deltas have
  no time of their own; the minute lines have one when the caller passes `year`), and
  dmesg -d `[  123.456789 <    0.000004>]`
- dmesg --time-format iso `2026-11-30T07:31:02,123456+00:00`, with or without
  dmesg --decode's `kern  :warn  : ` facility prefix
- syslog and journalctl short / short-precise `Nov 30 07:31:02[.123456] host kernel: `
  (no year: the wall time is derived only when the caller passes `year`)
- journalctl short-iso / short-iso-precise and RFC 3339 syslog
  `2026-11-30T07:31:02[.123456]+00:00 host kernel: `
- journalctl short-full `Mon 2026-11-30 07:31:02 UTC host kernel: ` and short-unix
  `1795847462.123456 host kernel: `
- /dev/kmsg records `pri,seq,usec,flags[,...];message` plus continuation lines
- any of the wall-clock forms followed by a kernel `[  123.456789]` stamp
- talosctl dmesg `[<node>: ]kern:    warn: [2026-11-30T07:31:02.123456789Z]: `
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any, BinaryIO

from gpuvigil.node.bus_ids import normalize_bus_id
from gpuvigil.node.checks.kernel_log.log_lines import LineStats, find_lines, iter_lines

if TYPE_CHECKING:
    from gpuvigil.node.checks.kernel_log.readings import XidEvent, XidSource

# The event itself, searched anywhere in the line. The look-behind keeps "fooXid (" out.
# The driver's optional `pid=<n|'<unknown>'>, name=<process>, ` fields are matched in the
# same pass (one regex per event line: the event path is what logscan's speed is made of).
# The code is not range-checked here: a code no catalog knows (or one too long to be real,
# cut to 20 digits; the line is kept) is an event judged as unknown, never a dropped line.
# So is a negative code (kept as printed) and one that is not a number at all (`abc`,
# `0x4f`): that one is UNREADABLE_CODE, with the printed text at the front of its message.
_EVENT = re.compile(
    r"(?<![A-Za-z0-9_])(?:(nvidia-nvswitch\d+): )?(S?)Xid \((?:PCI:)?([^()\s]{1,40})\): "
    r"(?:(-?\d{1,20})\d*\b|([^\s,]{1,20})[^\s,]*),? ?"
    r"(?:pid=('?<unknown>'?|\d+|'?\d+'?),\s*(?:name=(.*?),\s*)?)?(.*)"
)
# The code of an event whose printed code is not a number: no catalog has it, so it is
# judged as an unknown code (FAILED, INVESTIGATE), never dropped as a line we do not read.
UNREADABLE_CODE = -1
_DRIVER_LOAD = re.compile(r"NVRM: loading NVIDIA UNIX")

# Prefixes, tried at the start of the line (after any `<pri>` and kmsg header).
_PRI = re.compile(r"^<\d{1,3}>")
_KMSG = re.compile(r"^(\d{1,3}),(\d{1,20}),(\d{1,20}),[^;]{0,64};")
_FACILITY = re.compile(r"^[a-z]{2,8}\s*:[a-z]{2,8}\s*: ")
# talosctl dmesg: "[<node>: ]kern:    info: [2021-11-10T10:09:37.662764956Z]: "
_TALOS = re.compile(
    r"^(?:\S+: )?kern:\s*[a-z]{2,8}:\s*\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?"
    r"(?:Z|[+-]\d\d:?\d\d))\]:\s"
)
_MONO = re.compile(r"\[\s*(\d{1,12}\.\d{1,9})\]")
# dmesg -H / --time-format reltime: a minute line `[Dec 2 10:15]` (`%b%e %H:%M`, so also
# `[Dec12 10:15]`, and `[Dec 2 10:15:01]` on some builds), then `[  +0.000004]` deltas.
# dmesg -d adds the delta to the monotonic stamp: `[  123.456789 <    0.000004>]`.
_HUMAN = re.compile(r"^\[(([A-Z][a-z]{2}) ?\s?(\d{1,2}) (\d\d):(\d\d)(?::(\d\d))?)\]")
_DELTA = re.compile(r"^\[\s*(\+\s*\d{1,12}\.\d{1,9}|\d{1,12}\.\d{1,9}\s*<\s*[\d.]+>)\]")
_CTIME = re.compile(
    r"^\[((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Z][a-z]{2}) {1,2}(\d{1,2}) "
    r"(\d\d):(\d\d):(\d\d) (\d{4}))\]"
)
_ISO = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?)(?= )")
_SYSLOG = re.compile(
    r"^(([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?)(?= \S+ )"
)
# journalctl -o short-full: "Mon 2026-11-30 07:31:02 UTC host kernel: "
_FULL = re.compile(
    r"^((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})?)"
    r"(?: ([A-Z]{3,5}|[+-]\d{4}))?)(?= )"
)
# journalctl -o short-unix: "1795000000.123456 host kernel: "
_UNIX = re.compile(r"^(\d{9,11}\.\d{1,9})(?= \S+ )")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}
_UNKNOWN = frozenset({"<unknown>", "'<unknown>'", ""})


@dataclass(frozen=True, slots=True)
class Stamp:
    """A line's time stamp: as printed, and what could be derived from it."""

    text: str | None = None
    time: datetime | None = None
    uptime_s: float | None = None


def parse_line(
    line: str,
    *,
    source: XidSource = "file",
    tz: tzinfo = UTC,
    year: int | None = None,
) -> XidEvent | None:
    """One log line -> the Xid/SXid event on it, or None. Never raises.

    `tz` is the zone of wall-clock stamps printed without an offset (dmesg -T, syslog);
    `year` completes syslog stamps, which print none (without it their `time` is None).
    """
    if "Xid (" not in line:  # the cheap pre-filter: most lines stop here
        return None
    try:
        return _parse(line.rstrip("\r\n"), source=source, tz=tz, year=year)
    except (ValueError, OverflowError, IndexError):  # a stamp like Feb 30: no event time
        return None


def _parse(line: str, *, source: XidSource, tz: tzinfo, year: int | None) -> XidEvent | None:
    fields = _fields(line, source, tz, year)
    return None if fields is None else _event(*fields)


def _event(*fields: object) -> XidEvent:
    """`XidEvent(*fields)`, imported at the first event: `logscan --json` builds none, and
    `readings` costs 0.026 s of its start-up."""
    global _event  # replaced by the class itself after the first call
    from gpuvigil.node.checks.kernel_log.readings import XidEvent

    _event = XidEvent
    return XidEvent(*fields)


# An event's fields in XidEvent's order (kind, code, pci_bus_id, bus_id, message, line,
# timestamp, time, uptime_s, source, seq, pid, process, device): `logscan --json` writes
# them without building the frozen dataclass, whose __init__ was a third of an event's
# parse (2.6 us of 8.5).
EventFields = tuple[
    str, int, str, "str | None", str, str, "str | None", "datetime | None", "float | None",
    "XidSource", "int | None", "int | None", "str | None", "str | None",
]  # fmt: skip


def _fields(
    line: str, source: XidSource, tz: tzinfo, year: int | None, at: int = -1
) -> EventFields | None:
    """`at`: where `Xid (` first is in `line`, when the caller has found it. A match
    starts with an SXid's device (`nvidia-nvswitchN: `), else at its `S` or `X`: with no
    device name before `at` the search starts there (the look-behind still sees the text
    before it), which spares trying every position of the stamp (1.7 us -> 1.2 us)."""
    start = 0
    if at > 0 and line.find("nvidia-nvswitch", 0, at) < 0:
        start = at - 1
    m = _EVENT.search(line, start)
    if m is None:
        return None
    device, s, printed_bus, code_text, odd_code, pid_text, name, message = m.groups()
    kind = "sxid" if s else "xid"
    if kind == "xid" and device:
        return None  # a switch never prints a plain Xid: not a line we understand
    seq = None
    head = line[: m.start()]
    # Raw dmesg's `[  123.456789]` first, as `_stamp` would read it (no talosctl `kern:`
    # before it): the most common stamp, without the call and the tests of the others.
    mono = _MONO.match(head) if head[:1] == "[" and "kern:" not in head else None
    km = _KMSG.match(head) if mono is None and head[:1].isdigit() else None
    if mono is not None:
        text = mono.group(1)
        when, uptime = None, float(text)
    elif km is not None:
        seq = int(km.group(2))
        text, when, uptime = km.group(3), None, int(km.group(3)) / 1e6
    else:
        try:
            text, when, uptime = _stamp(head, tz=tz, year=year)
        except (ValueError, OverflowError, IndexError):  # a stamp like Feb 30: no event time
            text, when, uptime = None, None, None
    pid = process = None
    if pid_text is not None:
        pid_text = pid_text.strip("'")
        pid = int(pid_text) if pid_text.isdigit() else None
        name = name.strip() if name is not None else None
        if name is not None and name not in _UNKNOWN:
            process = name
    message = message.strip()
    bus_id = normalize_bus_id(printed_bus)
    if code_text is None:  # not a number: kept, and what was printed is said
        if bus_id is None:
            return None  # no bus id and no code: binary noise that spells `Xid (`, no event
        code = UNREADABLE_CODE
        message = f"[unreadable code {odd_code!r}] {message}".rstrip()
    else:
        code = int(code_text)
    return (kind, code, printed_bus, bus_id, message,
            line, text, when, uptime, source, seq, pid, process, device)  # fmt: skip


def parse_stamp(head: str, *, tz: tzinfo = UTC, year: int | None = None) -> Stamp:
    """The time stamp at the start of `head` (the text before the message).

    A stamp that matches a format but is not a real time (Feb 30) yields an empty Stamp:
    the event still counts, it only has no time.
    """
    try:
        return Stamp(*_stamp(head, tz=tz, year=year))
    except (ValueError, OverflowError, IndexError):
        return Stamp()


_NONE = (None, None, None)


def _stamp(
    head: str, *, tz: tzinfo, year: int | None
) -> tuple[str | None, datetime | None, float | None]:
    """(text, time, uptime_s) of the stamp at the start of `head`. Each regex is tried
    only where its first character could start it (the same result, fewer calls)."""
    if "kern:" in head:
        tm = _TALOS.match(head)
        if tm is not None:
            text = tm.group(1)
            return text, datetime.fromisoformat(text.replace("Z", "+00:00")), None
    if head[:1] == "<":
        pm = _PRI.match(head)
        if pm is not None:
            head = head[pm.end() :]
    if head[:1].islower():
        fm = _FACILITY.match(head)
        if fm is not None:
            head = head[fm.end() :]
    if head.startswith("["):
        mm = _MONO.match(head)
        if mm is not None:
            return (mm.group(1), None, float(mm.group(1)))
        cm = _CTIME.match(head)
        if cm is not None:
            text, mon, day, hh, mi, ss, yy = cm.groups()
            when = datetime(int(yy), _MONTHS[mon], int(day), int(hh), int(mi), int(ss), tzinfo=tz)
            return (text, when, _inner_uptime(head[cm.end() :]))
        dm = _DELTA.match(head)
        if dm is not None:  # relative to the line before: no time of its own
            text = dm.group(1)
            up = None if text.startswith("+") else float(text.split("<")[0])
            return (text, None, up)
        hm = _HUMAN.match(head)
        if hm is not None and hm.group(2) in _MONTHS:
            text, mon, day, hh, mi, ss = hm.groups()
            when = None
            if year is not None:
                when = datetime(
                    year, _MONTHS[mon], int(day), int(hh), int(mi), int(ss or 0), tzinfo=tz
                )
            return (text, when, None)
        return _NONE
    im = _ISO.match(head)
    if im is not None:
        text = im.group(1)
        when = datetime.fromisoformat(text.replace(",", ".").replace(" ", "T"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=tz)
        return (text, when, _inner_uptime(head[im.end() :]))
    fm = _FULL.match(head)
    if fm is not None:
        text, clock, zone = fm.groups()
        when = datetime.fromisoformat(clock.replace(" ", "T"))
        if zone in {"UTC", "GMT"} or zone is None:
            when = when.replace(tzinfo=UTC if zone else tz)
        elif zone[0] in "+-":
            when = datetime.fromisoformat(f"{clock.replace(' ', 'T')}{zone}")
        else:
            when = None  # a zone abbreviation other than UTC: ambiguous, keep the text only
        return (text, when, _inner_uptime(head[fm.end() :]))
    um = _UNIX.match(head)
    if um is not None:
        when = datetime.fromtimestamp(float(um.group(1)), tz=UTC)
        return (um.group(1), when, _inner_uptime(head[um.end() :]))
    sm = _SYSLOG.match(head)
    if sm is not None:
        text, mon, day, hh, mi, ss, frac = sm.groups()
        when = None
        if year is not None and mon in _MONTHS:
            micro = int((frac or "0")[:6].ljust(6, "0"))
            when = datetime(
                year, _MONTHS[mon], int(day), int(hh), int(mi), int(ss), micro, tzinfo=tz
            )
        return (text, when, _inner_uptime(head[sm.end() :]))
    return _NONE


def _inner_uptime(after: str) -> float | None:
    """A kernel `[  123.456]` stamp after a syslog/journal wall-clock prefix."""
    if "[" not in after:
        return None
    mm = _MONO.search(after)
    return float(mm.group(1)) if mm is not None else None


def parse_kmsg_record(raw: bytes | str, *, boot_id: str | None = None) -> XidEvent | None:
    """One /dev/kmsg record (`pri,seq,usec,flags[,...];message` + continuation lines).

    The continuation lines (` SUBSYSTEM=pci`, ` DEVICE=+pci:...`) are dropped; the
    kernel escapes non-printable bytes in the message as \\xNN, so decoding is lossless
    for well-formed records and replaces bytes in malformed ones. Never raises.
    """
    try:
        text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
        first = text.split("\n", 1)[0]
        if "Xid (" not in first:
            return None
        km = _KMSG.match(first)
        if km is None:
            return None
        ev = _parse(first, source="kmsg", tz=UTC, year=None)
    except (ValueError, OverflowError, IndexError, TypeError):
        return None
    if ev is None:
        return None
    return ev.with_(boot_id=boot_id) if boot_id else ev


def kmsg_records(data: bytes) -> list[bytes]:
    """Split bytes read from /dev/kmsg (one record per read on the device, or many when a
    capture is read from a file) into records; continuation lines start with a space."""
    out: list[bytes] = []
    for line in data.split(b"\n"):
        if line.startswith(b" ") and out:
            out[-1] += b"\n" + line
        elif line:
            out.append(line)
    return out


def driver_load_stamp(line: str, *, tz: tzinfo = UTC, year: int | None = None) -> Stamp | None:
    """The stamp of an `NVRM: loading NVIDIA UNIX ... Kernel Module` line, else None."""
    m = _DRIVER_LOAD.search(line) if "NVRM: loading" in line else None
    if m is None:
        return None
    return stamp_before(line, m.start(), tz=tz, year=year)


def is_kmsg_record(line: str) -> bool:
    """`pri,seq,usec,flags;message`: a /dev/kmsg record (or a capture of one)."""
    return _KMSG.match(line) is not None


def fix_year(ev: XidEvent, now: datetime) -> XidEvent:
    """Syslog stamps have no year: one that lands in the future is from last year."""
    if (
        ev.time is not None
        and ev.time > now + timedelta(days=1)
        and ev.timestamp
        and ev.timestamp[:1].isalpha()
    ):
        try:
            return ev.with_(time=ev.time.replace(year=ev.time.year - 1))
        except ValueError:  # Feb 29
            return ev
    return ev


def stamp_before(line: str, pos: int, *, tz: tzinfo = UTC, year: int | None = None) -> Stamp:
    """The stamp of a line whose message starts at `pos` (a /dev/kmsg record's usec, or
    any prefix `parse_stamp` knows). Never raises."""
    head = line[:pos]
    km = _KMSG.match(head)
    if km is not None:
        return Stamp(km.group(3), None, int(km.group(3)) / 1e6)
    return parse_stamp(head, tz=tz, year=year)


# --- bulk scanning ------------------------------------------------------------------------

_NEEDLE = b"Xid ("
_CHUNK = 8 * 1024 * 1024


def event_lines(
    buf: bytes, needle: bytes = _NEEDLE, *, start: int = 0, end: int | None = None
) -> Iterator[bytes]:
    """Each line of `buf[start:end]` that contains `needle`, in order, once per line: one
    `bytes.find` per hit instead of one Python step per line (`log_lines.find_lines`)."""
    return find_lines(buf, (needle,), start=start, end=end)


def scan_bytes(
    buf: bytes,
    *,
    source: XidSource = "file",
    tz: tzinfo = UTC,
    year: int | None = None,
    start: int = 0,
    end: int | None = None,
) -> list[XidEvent]:
    """Every Xid/SXid event in `buf` (a whole log), in order of appearance."""
    out = []
    for raw in event_lines(buf, start=start, end=end):
        ev = parse_line(raw.decode("utf-8", errors="replace"), source=source, tz=tz, year=year)
        if ev is not None:
            out.append(ev)
    return out


def iter_stream(stream: BinaryIO, **options: Any) -> Iterator[XidEvent]:
    """Events from a binary stream of any size, read in chunks (`log_lines`: bare CR ends a
    line, an Xid in an over-long line is still found, memory stays bounded). `options`:
    `iter_stream_fields`'s (source, tz, year, chunk_size, stats)."""
    for fields in iter_stream_fields(stream, **options):
        yield _event(*fields)


def iter_stream_fields(
    stream: BinaryIO,
    *,
    source: XidSource = "file",
    tz: tzinfo = UTC,
    year: int | None = None,
    chunk_size: int = _CHUNK,
    stats: LineStats | None = None,
) -> Iterator[EventFields]:
    """`iter_stream`'s events as their fields (`EventFields`)."""
    for line, at in iter_xid_lines(stream, chunk_size=chunk_size, stats=stats):
        fields = event_fields(line, at, source=source, tz=tz, year=year)
        if fields is not None:
            yield fields


def iter_xid_lines(
    stream: BinaryIO, *, chunk_size: int = _CHUNK, stats: LineStats | None = None
) -> Iterator[tuple[str, int]]:
    """Each line of `stream` that holds `Xid (`, decoded, with where `Xid (` is in it:
    what `event_fields` takes (`logscan --json` writes its common lines itself)."""
    for raw in iter_lines(stream, (_NEEDLE,), chunk_size=chunk_size, stats=stats):
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        at = line.find("Xid (")  # parse_line's pre-filter (a window of an over-long line)
        if at >= 0:
            yield line, at


def event_fields(
    line: str, at: int, *, source: XidSource = "file", tz: tzinfo = UTC, year: int | None = None
) -> EventFields | None:
    """The event's fields of a line holding `Xid (` at `at`, or None. Never raises."""
    try:
        return _fields(line, source, tz, year, at)
    except (ValueError, OverflowError, IndexError):  # as parse_line: no event
        return None


# For `logscan --json`'s own writing of the common line (a raw dmesg stamp), which must
# give what `_fields` gives: the event's pattern, the stamp's, the names that are no process.
EVENT_PATTERN, MONO_PATTERN, UNKNOWN_NAMES = _EVENT, _MONO, _UNKNOWN


def with_wall_time(events: Iterable[XidEvent], booted_at: datetime | None) -> list[XidEvent]:
    """Give events that carry only seconds-since-boot a wall time, when the boot time is
    known (the check reads it from /proc/stat's btime)."""
    if booted_at is None:
        return list(events)
    return [
        ev.with_(time=booted_at + timedelta(seconds=ev.uptime_s))
        if ev.time is None and ev.uptime_s is not None
        else ev
        for ev in events
    ]
