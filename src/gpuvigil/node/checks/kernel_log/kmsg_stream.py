"""Follows the kernel log as a stream for the agent: /dev/kmsg first, fallbacks after.

Called by the agent (`gpuvigil.node.kernel_watch`). One reader thread; it hands batches of
raw records to a callback, first the records since boot (once, at start, `boot=True`),
then everything logged while the agent runs.

Sources, in the order `auto` tries them:
- `/dev/kmsg`: one record per read(2), each with the kernel's sequence number. A reader
  that falls behind the ring buffer gets EPIPE once, then continues at the oldest record
  still held: the lost records are reported as a gap (KMSG_GAP), sized from the sequence
  numbers on either side.
- `dmesg` polled by time stamp, then `journalctl -k` polled with a cursor (bounded runs
  through the fail-closed runner rather than a `-f` child that could hang unseen).
  Using either says so: a SOURCE_FALLBACK warning naming why /dev/kmsg failed.
- a plain file (`--kmsg-file`): its newest `node.kernel_log.max_bytes` as the records
  since boot, then lines appended later, for trying the agent anywhere and for tests. A
  file truncated, rewritten in place (even refilled past where we were, within one poll:
  the bytes before our position are checked each time) or replaced by another is read
  again from its start, and said so (a KMSG_GAP warning: lines may be missing). What the
  rotation would lose is read first: a replaced file's rest (kept open while a writer
  still appends to it), or a truncated one's unread bytes from logrotate's copy. One that
  stays deleted is a failure (nothing new can be read); a writer that outruns the reader
  by more than `max_bytes` is skipped ahead, counted as lost lines.

Memory stays constant whatever the source holds or how fast it grows: every read takes at
most `BATCH_BYTES` / `BATCH_RECORDS`, and the reader hands each batch on before the next.
"""

from __future__ import annotations

import errno
import os
import re
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from gpuvigil.core.findings import Finding, Status
from gpuvigil.io import exec as ex
from gpuvigil.node.file_watch import FileWatch

STREAM_CHECK = "kernel_log"  # the stream stands in for the one-shot check of that name
_KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;")
_DMESG_TS = re.compile(r"^\[\s*(\d+\.\d+)\]")
MAX_LINE = 64 * 1024  # the kernel's records are < 1 KiB; a runaway file line is cut here
BATCH_BYTES = 1 << 20  # at most this much read per call: memory stays flat under a flood
BATCH_RECORDS = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # node.kernel_log.max_bytes
FINGERPRINT = 64  # bytes before the read position, checked for an in-place rewrite
FINGERPRINT_EVERY = 10  # ... on every poll that finds data, and every 10th idle one
KMSG_BEAT_S = 5.0  # /dev/kmsg wakes on records; between them, a liveness beat this often


@dataclass(frozen=True)
class Record:
    """One kernel log line: `/dev/kmsg` record text (`pri,seq,usec,flags;msg`) or a text
    line (dmesg, journal, file). `seq` is set for /dev/kmsg records."""

    text: str
    source: str  # kmsg | journal | dmesg | file
    seq: int | None = None


OnRecords = Callable[[list[Record], bool], None]  # (records, boot)


@dataclass
class StreamHealth:
    """What the reader knows about itself, for the stream's findings and staleness."""

    source: str = "none"
    fallback_from: list[tuple[str, str]] = field(default_factory=list)
    gaps: int = 0  # records lost, total
    gap_events: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, lost)
    alive_at: float = field(default_factory=time.monotonic)
    error: Finding | None = None  # the latest poll failed (journalctl/dmesg), until it works
    records: int = 0
    rewinds: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, why)


class Source:
    name = "none"
    backlog_left = False  # the records since boot are not all read yet (read in batches)

    def read(self, *, first: bool, wait_s: float) -> list[Record]:
        """Records available now (after waiting up to `wait_s` for some). Raises OSError
        for a broken source; returns [] when there is nothing new."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class DevKmsg(Source):
    name = "kmsg"

    def __init__(
        self,
        path: Path | None,
        *,
        health: StreamHealth,
        fd: int | None = None,
        beat_s: float | None = None,
    ) -> None:
        # `beat_s`: the longest idle wait (records wake the reader at once); None: the
        # caller's poll interval.
        self.beat_s = beat_s
        # `fd`: an already open record source (tests use a SOCK_SEQPACKET socket, which
        # keeps record boundaries the way /dev/kmsg does).
        self.fd = (
            fd if fd is not None else os.open(path or "/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        )
        self.health = health
        self.last_seq: int | None = None
        self.overrun = False

    def read(self, *, first: bool, wait_s: float) -> list[Record]:
        out: list[Record] = []
        if not first:
            # Records wake the select at once; without them only the liveness beat does.
            ready, _, _ = select.select([self.fd], [], [], max(wait_s, self.beat_s or 0.0))
            if not ready:
                return out
        size, self.backlog_left = 0, False
        while len(out) < BATCH_RECORDS and size < BATCH_BYTES:
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten before we read it
                    self.overrun = True
                    continue
                raise
            if not data:
                break
            size += len(data)
            self._take(data.decode("utf-8", errors="replace"), out)
        else:
            self.backlog_left = first  # more records wait: the next read goes on at once
        return out

    def _take(self, text: str, out: list[Record]) -> None:
        m = _KMSG_RECORD.match(text)
        seq = int(m.group(2)) if m else None
        if seq is not None and self.last_seq is not None and seq > self.last_seq + 1:
            lost = seq - self.last_seq - 1
            self.health.gaps += lost
            self.health.gap_events.append((time.monotonic(), lost))
        elif self.overrun and seq is not None and self.last_seq is None:
            self.health.gap_events.append((time.monotonic(), 0))
        self.overrun = False
        if seq is not None:
            self.last_seq = seq
        # Continuation lines (" SUBSYSTEM=pci") carry metadata, not the message.
        first_line = text.split("\n", 1)[0]
        out.append(Record(first_line, "kmsg", seq))

    def close(self) -> None:
        os.close(self.fd)


class FollowFile(Source):
    name = "file"

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        health: StreamHealth | None = None,
        missing_grace_s: float = 5.0,
    ) -> None:
        self.path, self.max_bytes = path, max_bytes
        self.health = health or StreamHealth()
        self.missing_grace_s = missing_grace_s
        self.missing_since: float | None = None
        self.fh = open(path, "rb")  # noqa: SIM115 - held open for the agent's life
        self._old = []
        self._start(tail=True)
        self.watch = FileWatch(path)

    def _start(self, *, tail: bool) -> None:
        """Read from the start, or (`tail`) from the newest `max_bytes` on a line start."""
        st = os.fstat(self.fh.fileno())
        self.ino, self.dev = st.st_ino, st.st_dev
        start = max(0, st.st_size - self.max_bytes) if tail else 0
        self.fh.seek(start)
        if start:
            self.fh.readline(MAX_LINE)  # the rest of a cut line
        self.partial = b""
        self.backlog_left = True

    def _reopen(self, why: str) -> list[Record]:
        """Follow the file now at `path`; returns what the rotation would have lost: for a
        replaced file (rename+create, delete+create) the rest of the old one, which stays
        open while a writer still appends to it; for one truncated or rewritten in place
        (copytruncate) the bytes we had not read, from the rotated copy."""
        saved: list[Record] = []
        if why == "replaced":
            self._old.append(_Draining(self.fh, self.partial, time.monotonic()))
        else:
            saved = self._from_rotated_copy(self.fh.tell(), self.partial)
            self.fh.close()
        self.fh = open(self.path, "rb")  # noqa: SIM115
        self._start(tail=True)
        self.watch.rewatch()
        self.health.rewinds.append((time.monotonic(), why))
        return saved

    def _from_rotated_copy(self, pos: int, partial: bytes) -> list[Record]:
        """The bytes after `pos` in the copy logrotate made before truncating (a sibling
        named `<name>.1`, `<name>-<date>`, ...; compressed ones cannot be the fresh copy),
        recognised by the bytes we read last: they sit just before `pos` in it."""
        seen, name = self._seen, self.path.name
        try:
            siblings = [
                p for p in self.path.parent.iterdir()
                if p.name.startswith(name) and p.name != name
                and not p.name.endswith((".gz", ".xz", ".bz2", ".zst"))
            ]  # fmt: skip
            siblings.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        except OSError:
            return []
        for copy in siblings[:4]:
            try:
                with open(copy, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    if size <= pos or os.pread(fh.fileno(), len(seen), pos - len(seen)) != seen:
                        continue
                    fh.seek(pos)
                    data = fh.read(min(size - pos, self.max_bytes))
            except OSError:
                continue
            return self._records(partial + data, final=True)[0]
        return []

    def _read_old(self) -> list[Record]:
        """What was appended to files rotated away (a writer that has not reopened yet);
        each is let go once it has been quiet for `missing_grace_s`."""
        out: list[Record] = []
        now = time.monotonic()
        for d in list(self._old):
            data = d.fh.read(BATCH_BYTES)
            if data:
                d.last_growth = now
                recs, d.partial = self._records(d.partial + data)
                out += recs
            elif now - d.last_growth >= self.missing_grace_s:
                out += self._records(d.partial, final=True)[0]
                d.fh.close()
                self._old.remove(d)
        return out

    def _records(self, data: bytes, *, final: bool = False) -> tuple[list[Record], bytes]:
        """Whole lines as records, and the unterminated rest (a record too, if `final`)."""
        lines = data.split(b"\n")
        partial = lines.pop()
        if final or len(partial) > MAX_LINE:  # no kernel line is this long
            lines.append(partial[:MAX_LINE])
            partial = b""
        recs = [_text_record(ln.decode("utf-8", errors="replace"), "file") for ln in lines if ln]
        return recs, partial

    def _moved_under_us(self) -> tuple[str | None, int]:
        """Why the file must be read again from its start, if it must (deleted after a
        grace for rotation, replaced, truncated, or rewritten in place), and its size.
        One stat(2) per poll; the bytes before our position are compared (one pread) when
        the file grew, and every `FINGERPRINT_EVERY` polls when it did not."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            now = time.monotonic()
            self.missing_since = self.missing_since or now
            if now - self.missing_since >= self.missing_grace_s:
                raise PollFailed(self._deleted(now - self.missing_since)) from None
            return None, -1
        except OSError:
            return None, -1
        if self.missing_since is not None:
            self.missing_since = None
            return "replaced", st.st_size  # deleted, then created again
        if (st.st_ino, st.st_dev) != (self.ino, self.dev):
            return "replaced", st.st_size
        pos = self.fh.tell()
        if st.st_size < pos:
            return "truncated", st.st_size
        self._idle = 0 if st.st_size > pos else self._idle + 1
        seen = self._seen
        check = st.st_size > pos or self._idle % FINGERPRINT_EVERY == 0
        if seen and check and os.pread(self.fh.fileno(), len(seen), pos - len(seen)) != seen:
            return "rewritten", st.st_size
        return None, st.st_size

    def _deleted(self, for_s: float) -> Finding:
        return Finding(
            check=STREAM_CHECK,
            status=Status.FAILED,
            code="DEPENDENCY_MISSING",
            component=f"file:{self.path}",
            message=f"the kernel log file {self.path} was deleted {for_s:.0f} s ago: "
            "nothing logged from now on can be read",
            evidence={"path": str(self.path), "missing_for_s": round(for_s, 1)},
        )

    def read(self, *, first: bool, wait_s: float) -> list[Record]:
        # Older lines first: the rest of a file rotated away comes before the new file's.
        out = self._read_old() if self._old else []
        why, size = self._moved_under_us()
        if why is not None:
            out += self._reopen(why)
            out += self._read_old()  # a replaced file's unread rest, before the new file
        elif out:
            return out  # the new file's lines on the next call
        elif not first and 0 <= size <= self.fh.tell():
            # Nothing new: with inotify sleep until the file changes (or a liveness beat),
            # else poll again after `wait_s`; while an old file drains, poll.
            active = self.watch.active and not self._old
            self.watch.wait(max(wait_s, KMSG_BEAT_S) if active else wait_s)
            return []
        self._skip_if_outrun()
        data = self.fh.read(BATCH_BYTES)
        if not data:
            self.backlog_left = False
            if not first and not out:
                time.sleep(wait_s)
            return out
        self._seen = data[-FINGERPRINT:]
        recs, self.partial = self._records(self.partial + data)  # a cut line waits
        return out + recs

    _old: list[_Draining]  # files rotated away that may still grow
    _seen = b""  # the last bytes read: still there before our position unless rewritten
    _idle = 0  # polls in a row that found nothing new

    def _skip_if_outrun(self) -> None:
        """A writer more than `max_bytes` ahead: skip to its newest `max_bytes`, counting
        the lines skipped as lost (as /dev/kmsg does when its ring buffer is overrun)."""
        pos, size = self.fh.tell(), os.fstat(self.fh.fileno()).st_size
        if size - pos <= self.max_bytes:
            return
        self.fh.seek(size - self.max_bytes)
        self.fh.readline(MAX_LINE)
        self.partial, self._seen = b"", b""
        lost = max(1, (size - self.max_bytes - pos) // 100)  # ~100 bytes a kernel line
        self.health.gaps += lost
        self.health.gap_events.append((time.monotonic(), lost))

    def close(self) -> None:
        self.watch.close()
        self.fh.close()
        for d in self._old:
            d.fh.close()
        self._old = []


@dataclass
class _Draining:
    """A followed file after it was rotated away, still read until it has been quiet."""

    fh: BinaryIO
    partial: bytes
    last_growth: float


class Journalctl(Source):
    name = "journal"

    def __init__(self, *, timeout_s: float, env: dict[str, str] | None = None) -> None:
        self.cursor: str | None = None
        self.timeout_s, self.env = timeout_s, env

    def read(self, *, first: bool, wait_s: float) -> list[Record]:
        if not first:
            time.sleep(wait_s)
        argv = ["journalctl", "-k", "--no-pager", "-o", "short-monotonic", "--show-cursor"]
        argv += ["-b"] if self.cursor is None else [f"--after-cursor={self.cursor}"]
        res = ex.run(argv, timeout_s=self.timeout_s, env=self.env)
        bad = ex.failure_finding(res, check=STREAM_CHECK)
        if bad is not None:
            raise PollFailed(bad)
        out = []
        for line in res.text.splitlines():
            if line.startswith("-- cursor: "):
                self.cursor = line[len("-- cursor: ") :].strip()
            elif line and not line.startswith("-- "):
                out.append(_text_record(line, "journal"))
        return out


class Dmesg(Source):
    name = "dmesg"

    def __init__(self, *, timeout_s: float, env: dict[str, str] | None = None) -> None:
        self.last_ts = -1.0
        self.timeout_s, self.env = timeout_s, env

    def read(self, *, first: bool, wait_s: float) -> list[Record]:
        if not first:
            time.sleep(wait_s)
        res = ex.run(["dmesg", "--kernel"], timeout_s=self.timeout_s, env=self.env)
        bad = ex.failure_finding(res, check=STREAM_CHECK)
        if bad is not None:
            raise PollFailed(bad)
        out, newest = [], self.last_ts
        for line in res.text.splitlines():
            m = _DMESG_TS.match(line)
            ts = float(m.group(1)) if m else None
            if ts is not None and ts <= self.last_ts:
                continue
            newest = max(newest, ts or newest)
            out.append(_text_record(line, "dmesg"))
        self.last_ts = newest
        return out


class PollFailed(Exception):
    def __init__(self, finding: Finding) -> None:
        super().__init__(finding.message)
        self.finding = finding


def _text_record(line: str, source: str) -> Record:
    m = _KMSG_RECORD.match(line)  # a file may hold raw /dev/kmsg records
    return Record(line, source, int(m.group(2)) if m else None)


def open_source(
    *,
    mode: str,
    kmsg_path: Path,
    file: Path | None,
    poll_timeout_s: float,
    env: dict[str, str],
    health: StreamHealth,
    max_bytes: int = DEFAULT_MAX_BYTES,
    missing_grace_s: float = 5.0,
) -> Source | None:
    """The first source that works, recording why earlier ones did not."""
    if file is not None or mode == "file":
        if file is None:
            health.fallback_from.append(("file", "kernel_log.source is file but no file set"))
            return None
        try:
            return FollowFile(
                file, max_bytes=max_bytes, health=health, missing_grace_s=missing_grace_s
            )
        except OSError as e:
            health.fallback_from.append((str(file), e.strerror or str(e)))
            return None
    # The same order as the one-shot kernel_log check: dmesg reads the same ring buffer
    # through util-linux; the journal may lag or be rate-limited.
    order = {
        "auto": ["kmsg", "dmesg", "journal"],
        "kmsg": ["kmsg"],
        "journal": ["journal"],
        "dmesg": ["dmesg"],
    }.get(mode, ["kmsg"])
    for name in order:
        if name == "kmsg":
            try:
                return DevKmsg(kmsg_path, health=health, beat_s=KMSG_BEAT_S)
            except OSError as e:
                health.fallback_from.append((str(kmsg_path), e.strerror or str(e)))
        elif ex.resolve("journalctl" if name == "journal" else "dmesg", env.get("PATH")):
            cls = Journalctl if name == "journal" else Dmesg
            return cls(timeout_s=poll_timeout_s, env=env)
        else:
            health.fallback_from.append((name, "not installed"))
    return None


class KmsgStream:
    """The reader thread. `health` is read by the stream check; records go to `on_records`."""

    def __init__(
        self,
        source: Source | None,
        *,
        on_records: OnRecords,
        health: StreamHealth,
        poll_interval_s: float,
    ) -> None:
        self.source, self.on_records, self.health = source, on_records, health
        self.poll_interval_s = poll_interval_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="kmsg-stream", daemon=True)
        self.health.source = source.name if source else "none"

    def start(self) -> None:
        if self.source is not None:
            self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        assert self.source is not None
        first = True
        while not self._stop.is_set():
            self.health.alive_at = time.monotonic()
            try:
                records = self.source.read(first=first, wait_s=self.poll_interval_s)
                if first and self.source.backlog_left:
                    # The records since boot, one bounded batch at a time.
                    self.health.records += len(records)
                    self.on_records(records, True)
                    continue
                self.health.error = None
            except PollFailed as e:
                self.health.error = e.finding
                time.sleep(self.poll_interval_s)
                continue
            except OSError as e:
                self.health.error = Finding(
                    check=STREAM_CHECK,
                    status=Status.FAILED,
                    code="CHECK_ERROR",
                    message=f"reading the kernel log ({self.source.name}) failed: {e}",
                )
                time.sleep(self.poll_interval_s)
                continue
            self.health.records += len(records)
            if records or first:
                self.on_records(records, first)
            first = False
        self.source.close()
