"""Streaming reader of the JSONL event log (`gpuvigil.core.events`).

Called by `gpuvigil report`, the SLO and attribution code, the simulator's report and the
benchmarks. It never raises on bad input: a torn last line, a garbage line, an over-long
line or an event that does not fit the envelope is skipped, counted in `ReadStats`, and
reported through `warn` (the first few of each file). Memory is bounded: lines are read one
at a time, capped at `MAX_LINE_BYTES`, and several files are merged by timestamp with a
k-way merge (each file is expected to be in time order, as every writer appends).
"""

from __future__ import annotations

import heapq
import io
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpuvigil.core.events import SCHEMA_VERSION, Event

MAX_LINE_BYTES = 1 << 20  # 1 MiB: far above any real event, bounds memory on garbage input
WARN_LIMIT = 5  # warnings per source; the rest are only counted
STDIN = "-"

Warn = Callable[[str], None]


@dataclass
class ReadStats:
    """What the reader saw; `skipped` counts lines it could not use, by reason."""

    lines: int = 0
    events: int = 0
    blank: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "events": self.events,
            "skipped": self.skipped_total,
            "skipped_by_reason": dict(sorted(self.skipped.items())),
            "sources": list(self.sources),
        }


def parse_line(line: bytes | str) -> tuple[Event | None, str]:
    """One line -> (event, "") or (None, reason). Never raises.

    Validation is done by hand (not by pydantic) because the report parses millions of
    lines; the checks match `Event`'s field types exactly, and `_event()` builds the
    frozen model without re-validating.
    """
    try:
        text = line.decode() if isinstance(line, bytes) else line
        obj, end = _DECODER.raw_decode(text, _WS.match(text).end())  # type: ignore[union-attr]
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, "not JSON"
    if end != len(text) and text[end:].strip():
        return None, "not JSON"
    if type(obj) is not dict:
        return None, "not a JSON object"
    if not _FIELDS.issuperset(obj):
        return None, "unknown envelope field"
    v = obj.get("v", SCHEMA_VERSION)
    ts = obj.get("ts")
    kind = obj.get("kind")
    source = obj.get("source")
    node = obj.get("node")
    job = obj.get("job")
    data = obj.get("data", {})
    if type(v) is not int or v > SCHEMA_VERSION:
        return None, "unknown schema version"
    if type(ts) is not float and type(ts) is not int:
        return None, "bad ts"
    if not math.isfinite(ts):
        return None, "bad ts"
    if type(kind) is not str or not kind or type(source) is not str:
        return None, "bad kind or source"
    if not (node is None or type(node) is str) or not (job is None or type(job) is str):
        return None, "bad node or job"
    if type(data) is not dict:
        return None, "bad data"
    fields = {"v": v, "ts": float(ts), "kind": kind, "source": source, "node": node, "job": job}
    fields["data"] = data
    return _event(fields), ""


_FIELDS = frozenset({"v", "ts", "kind", "source", "node", "job", "data"})
_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")
_ALL_FIELDS_SET = frozenset(Event.model_fields)
_setattr = object.__setattr__


def _event(fields: dict[str, Any]) -> Event:
    """What `Event.model_construct` does, minus its per-field bookkeeping (3x faster); the
    values were checked by `parse_line`. Equal to an `Event(...)` of the same values."""
    ev = Event.__new__(Event)
    _setattr(ev, "__dict__", fields)
    _setattr(ev, "__pydantic_fields_set__", _ALL_FIELDS_SET)
    _setattr(ev, "__pydantic_extra__", None)
    _setattr(ev, "__pydantic_private__", None)
    return ev


def _lines(stream: IO[bytes]) -> Iterator[tuple[bytes, bool]]:
    """Yield (line, complete) with each line capped at MAX_LINE_BYTES; an over-long line is
    yielded once as incomplete (its rest is discarded) so memory stays bounded."""
    while True:
        line = stream.readline(MAX_LINE_BYTES)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line, True
            continue
        if len(line) < MAX_LINE_BYTES:
            yield line, False  # no newline at end of file: possibly torn
            return
        # Over-long: drop the rest of this line.
        while True:
            rest = stream.readline(MAX_LINE_BYTES)
            if not rest or rest.endswith(b"\n"):
                break
        yield b"", False


def read_stream(
    stream: IO[bytes],
    *,
    name: str = "<stream>",
    stats: ReadStats | None = None,
    warn: Warn | None = None,
) -> Iterator[Event]:
    """Events from one binary stream, in file order; bad lines are skipped and counted."""
    stats = stats if stats is not None else ReadStats()
    stats.sources.append(name)
    warned = suppressed = 0
    lineno = 0
    for line, complete in _lines(stream):
        lineno += 1
        stats.lines += 1
        if complete and not line.strip():
            stats.blank += 1
            continue
        if not complete and not line:
            ev, reason = None, f"line longer than {MAX_LINE_BYTES} bytes"
        else:
            # A whole JSON object without its newline is a usable last line.
            ev, reason = parse_line(line)
            if ev is None and not complete:
                reason = "torn last line"
        if ev is None:
            stats.skip(reason)
            # The torn last line is always named: it is the one a crash of a writer leaves.
            if warned < WARN_LIMIT or not complete:
                if warn is not None:
                    warn(f"{name}:{lineno}: skipped ({reason})")
                warned += 1
            else:
                suppressed += 1
            continue
        stats.events += 1
        yield ev
    if warn is not None and suppressed:
        warn(f"{name}: {suppressed} more bad lines skipped")


def read_file(
    path: str | Path, *, stats: ReadStats | None = None, warn: Warn | None = None
) -> Iterator[Event]:
    """Events from one file, or from stdin when `path` is "-"."""
    if str(path) == STDIN:
        yield from read_stream(sys.stdin.buffer, name="<stdin>", stats=stats, warn=warn)
        return
    try:
        f = open(path, "rb", buffering=io.DEFAULT_BUFFER_SIZE * 16)  # noqa: SIM115
    except OSError as e:
        stats = stats if stats is not None else ReadStats()
        stats.sources.append(str(path))
        stats.skip("unreadable file")
        if warn is not None:
            warn(f"{path}: cannot read ({e.strerror or e})")
        return
    with f:
        yield from read_stream(f, name=str(path), stats=stats, warn=warn)


def read_events(
    paths: Iterable[str | Path], *, stats: ReadStats | None = None, warn: Warn | None = None
) -> Iterator[Event]:
    """Events from several files merged in timestamp order (a streaming k-way merge)."""
    sources = [read_file(p, stats=stats, warn=warn) for p in paths]
    if len(sources) == 1:
        yield from sources[0]
        return
    yield from heapq.merge(*sources, key=lambda e: e.ts)


def last_timestamp(path: str | Path, *, tail_bytes: int = 1 << 16) -> float | None:
    """The timestamp of the last parseable event of a file, read from its tail (cheap).

    `gpuvigil report --window` ends the window there when no `--end` is given, so a single
    streaming pass can tell events before the window (state only) from those inside it.
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, io.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            chunk = f.read()
    except OSError:
        return None
    for line in reversed(chunk.splitlines()):
        ev, _ = parse_line(line)
        if ev is not None:
            return ev.ts
    return None
