"""The lines of a log stream that contain a needle, read in chunks. Pure, bounded memory.

Used by `logscan` (one needle, `Xid (`) and by the kernel-log capture reader (several).
Hostile input gets a verdict, not a crash or a blow-up:

- a bare `\\r` ends a line like `\\n` (old syslog relays, logs from other systems); `\\r\\n`
  then reads as a line and an empty one;
- a line longer than `max_line` (a binary blob, a log without line ends) is not kept
  whole: every needle in it is still found, each with a window around it and the line's
  first bytes (where the time stamp is), so an Xid at the start of a 10 MB line is found;
- memory stays at about one chunk plus `max_line`, whatever the size of the stream.

Nothing is copied but the lines returned and the one line that straddles two chunks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import BinaryIO, Protocol

CHUNK = 8 * 1024 * 1024
MAX_LINE = 1024 * 1024
HEAD = 256  # the start of an over-long line kept for its time stamp
CONTROL_SAMPLE = 256 * 1024
WINDOW = 4096  # bytes kept after a needle in an over-long line


def find_lines(
    buf: bytes, needles: Sequence[bytes], *, start: int = 0, end: int | None = None
) -> Iterator[bytes]:
    """Each line of `buf[start:end]` holding any needle, in order, once per line."""
    stop = len(buf) if end is None else end
    if len(needles) == 1:
        yield from _one(buf, needles[0], start, stop)
        return
    starts: dict[int, int] = {}
    for needle in needles:
        pos = start
        while (hit := buf.find(needle, pos, stop)) >= 0:
            first = max(buf.rfind(b"\n", start, hit) + 1, start)
            last = buf.find(b"\n", hit, stop)
            last = stop if last < 0 else last
            starts.setdefault(first, last)
            pos = last + 1
    for first in sorted(starts):
        yield buf[first : starts[first]]


class Finder(Protocol):
    def __call__(
        self, buf: bytes, needles: Sequence[bytes], *, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]: ...


def _one(buf: bytes, needle: bytes, start: int, stop: int) -> Iterator[bytes]:
    find, rfind, search = buf.find, buf.rfind, _searcher(needle)
    pos = start
    while (m := search(buf, pos, stop)) is not None:
        hit = m.start()
        first = max(rfind(b"\n", start, hit) + 1, start)
        last = find(b"\n", hit, stop)
        if last < 0:
            last = stop
        yield buf[first:last]
        pos = last + 1


@cache
def _searcher(needle: bytes) -> Callable[..., re.Match[bytes] | None]:
    """`re`'s literal-prefix search: for a short needle it beats `bytes.find` (`Xid (`
    over 200 MB: 0.10 s against 0.15 s, measured); longer needles are the other way round,
    so the several-needle path keeps `bytes.find`."""
    return re.compile(re.escape(needle)).search


@dataclass
class LineStats:
    """What was seen of the whole stream, for the reader's verdict on it."""

    bytes_read: int = 0
    lines: int = 0
    long_lines: int = 0
    last_line: bytes = b""  # the last non-empty line (capped), for the capture's end time
    truncated: bool = False  # stopped at max_bytes
    stopped: str | None = None  # why the stream ended early (its reader's deadline)
    # NUL and other C0 bytes except \t \n \r \f \v: exact in the first chunk, then
    # estimated from the first CONTROL_SAMPLE bytes of each chunk (binary data is binary
    # throughout; counting every byte of a 200 MB log cost a third of logscan's scan).
    control_bytes: int = 0
    sample: bytearray = field(default_factory=bytearray)  # the first 64 KiB
    count_lines: bool = True  # False: `lines` stays 0 (logscan does not report it)
    gave_up: bool = False  # stopped early: binary data throughout and no needle (`give_up`)
    hits: int = 0  # lines yielded


_CONTROL = bytes(c for c in range(32) if c not in (9, 10, 11, 12, 13))


def iter_lines(
    stream: BinaryIO,
    needles: Sequence[bytes],
    *,
    chunk_size: int = CHUNK,
    max_line: int = MAX_LINE,
    max_bytes: int | None = None,
    stats: LineStats | None = None,
    give_up: int | None = None,
    find: Finder | None = None,
) -> Iterator[bytes]:
    """Lines of `stream` holding any of `needles` (see the module's rules). `give_up`:
    after that many bytes of which most are control bytes, with no needle found, stop (a
    2 GiB file of NUL bytes is binary: its verdict does not need the rest read). `find`:
    what searches each chunk's whole lines (`find_lines`, or grep's `GrepLines`)."""
    st = stats if stats is not None else LineStats()
    lines = _lines(
        stream,
        needles,
        chunk_size=chunk_size,
        max_line=max_line,
        max_bytes=max_bytes,
        st=st,
        give_up=give_up,
        find=find or find_lines,
    )
    if give_up is None:
        return lines  # logscan's path: no counting step per line
    return _counted(lines, st)


def _counted(lines: Iterator[bytes], st: LineStats) -> Iterator[bytes]:
    for line in lines:
        st.hits += 1
        yield line


def _lines(
    stream: BinaryIO,
    needles: Sequence[bytes],
    *,
    chunk_size: int,
    max_line: int,
    max_bytes: int | None,
    st: LineStats,
    give_up: int | None,
    find: Finder,
) -> Iterator[bytes]:
    tail = b""  # the start of the line that continues in the next chunk
    head = b""  # set while the current line is over-long: its first HEAD bytes
    while True:
        want = chunk_size
        if max_bytes is not None:
            want = min(want, max_bytes - st.bytes_read)
            if want <= 0:
                st.truncated = bool(stream.read(1))
                break
        if (
            give_up is not None
            and st.bytes_read >= give_up
            and not st.hits
            and st.control_bytes * 2 > st.bytes_read
        ):
            st.gave_up = True
            break
        # The last chunk is freed before the next is read, so that the read reuses its
        # memory: two 8 MiB chunks alive at once faulted in twice the pages (~0.02 s).
        chunk = found = None
        chunk = stream.read(want)
        if not chunk:
            break
        st.bytes_read += len(chunk)
        if len(st.sample) < 65536:
            st.sample += chunk[: 65536 - len(st.sample)]
        st.control_bytes += _control_bytes(chunk, exact=st.bytes_read == len(chunk))
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r", b"\n")
        first = chunk.find(b"\n")
        if first < 0:
            tail, head = yield from _grow(tail, head, chunk, needles, max_line=max_line, st=st)
            continue
        last = chunk.rfind(b"\n")
        # Asked for first: grep (`GrepLines`) searches the chunk while the lines are
        # counted and the line before it is finished here.
        found = find(chunk, needles, start=first + 1, end=last) if last > first else None
        if st.count_lines:
            st.lines += chunk.count(b"\n")
        yield from _finish(tail + chunk[:first], head, needles, st)
        head = b""
        if found is not None:
            yield from found
            _note_last(chunk, first + 1, last, st)
        tail = b""
        tail, head = yield from _grow(
            tail, head, chunk[last + 1 :], needles, max_line=max_line, st=st
        )
    if tail:
        st.lines += 1
        yield from _finish(tail, head, needles, st)


def _grow(
    tail: bytes,
    head: bytes,
    more: bytes,
    needles: Sequence[bytes],
    *,
    max_line: int,
    st: LineStats,
):  # -> Generator[bytes, None, tuple[bytes, bytes]]
    """Add `more` to an unfinished line; over `max_line`, yield the needles found so far
    (each as a window) and keep only what a needle near the end still needs."""
    line = tail + more
    if len(line) <= max_line and not head:
        return line, head
    if not head:
        head = line[:HEAD]
        st.long_lines += 1
    keep = WINDOW + max(len(n) for n in needles)
    yield from _windows(line, head, needles, upto=len(line) - keep)
    return line[-keep:], head


def _finish(line: bytes, head: bytes, needles: Sequence[bytes], st: LineStats):
    if line.strip():
        st.last_line = head if head else line[-4096:]
    if not head:
        yield from find_lines(line, needles)
    else:
        yield from _windows(line, head, needles, upto=len(line))


def _windows(line: bytes, head: bytes, needles: Sequence[bytes], *, upto: int):
    """One window per needle found before `upto`: the line's head, then the needle's
    surroundings (the head alone when the needle is in it)."""
    hits = sorted({h for n in needles for h in _all(line, n, upto)})
    for hit in hits:
        if hit < HEAD and line.startswith(head[:HEAD]):
            yield line[: hit + WINDOW].split(b"\n", 1)[0]
        else:
            stamp = head
            for n in needles:
                cut = stamp.find(n)
                if cut >= 0:
                    stamp = stamp[:cut]
            yield stamp + b" " + line[max(0, hit - 64) : hit + WINDOW].split(b"\n", 1)[0]


def _all(buf: bytes, needle: bytes, upto: int) -> Iterator[int]:
    pos = 0
    while (hit := buf.find(needle, pos, max(upto, 0) + len(needle))) >= 0 and hit < upto:
        yield hit
        pos = hit + 1


def _note_last(chunk: bytes, start: int, end: int, st: LineStats) -> None:
    stop = end
    while stop > start:
        begin = chunk.rfind(b"\n", start, stop) + 1
        begin = max(begin, start)
        if chunk[begin:stop].strip():
            st.last_line = chunk[max(begin, stop - 4096) : stop]
            return
        stop = begin - 1


def _control_bytes(chunk: bytes, *, exact: bool) -> int:
    if exact or len(chunk) <= CONTROL_SAMPLE:
        return len(chunk) - len(chunk.translate(None, _CONTROL))
    head = chunk[:CONTROL_SAMPLE]
    return (len(head) - len(head.translate(None, _CONTROL))) * len(chunk) // CONTROL_SAMPLE
