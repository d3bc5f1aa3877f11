"""The lines of a chunk that hold any of many needles, found by GNU grep's multi-string
search (`grep -F`, one pass for every needle) instead of one `bytes.find` pass per needle.

`analyze` scans a kernel log for ~41 literal markers (the Xid line, the driver load, the
GPU faults, every error phrase). No stdlib tool searches several literals in one pass at
memory speed (docs/performance.md), and 41 passes cost ~9x `logscan`'s one. grep is on
every machine this runs on, and its `-F` with many patterns is one pass over the bytes.

One grep runs for the whole stream: each chunk is written to it (from a thread, so that
grep's answers are read while it is fed), followed by a line holding only this stream's
end mark, a random word grep also looks for; the mark's offset says the chunk is done.
Its answers are line-buffered, so each line is handed on as grep finds it and Python
works on it while grep searches the rest of the chunk (two cores: both at once). One
process per chunk cost a start each (fork, the /proc sweep, grep's set-up): 27 per
213 MB, a third of the read.

It fails open to the exact answer, never to a wrong one: when grep is missing, exits,
runs past its deadline for a chunk, is killed, or prints an offset where its needle is
not (or out of order), the rest of that chunk is searched in Python (`find_lines`) from
the line after the last one handed on; a grep that exited is started again for the next
chunk, and after a missing binary or a deadline grep is not tried again for this stream.
What this cannot catch: a grep that omits a match it should have printed.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence

from gpuvigil.io import exec as runner
from gpuvigil.node.checks.kernel_log.log_lines import find_lines

log = logging.getLogger("gpuvigil.node.kernel_log")

TIMEOUT_S = 10.0  # an 8 MiB chunk takes grep ~20 ms; ten seconds is a stuck tool
# Below this many needles one `bytes.find` pass each is as fast as the process is to start.
MIN_NEEDLES = 4
_READ, _WRITE = 1 << 16, 1 << 20


class _Broken(Exception):
    """grep's answer for a chunk cannot be used; `stop`: do not start it again."""

    def __init__(self, why: str, *, stop: bool = False) -> None:
        super().__init__(why)
        self.stop = stop


_Job = tuple[runner.Spawned, bytes, int]


class GrepLines:
    """A `find_lines` for `log_lines.iter_lines(find=...)`, with grep doing the search.
    `close()` (or the `with` block) ends the grep; the owner of the stream calls it."""

    def __init__(self, needles: Sequence[bytes], *, binary: str = "grep") -> None:
        self.needles = tuple(needles)
        self._known = frozenset(self.needles)  # a row's needle is looked up once a row
        self.mark = b"gpuvigil-end-of-chunk-" + uuid.uuid4().hex.encode()
        argv = [binary, "-F", "-a", "-b", "-o", "--line-buffered"]
        for n in (*self.needles, self.mark):  # argument list, never a shell
            argv += ["-e", os.fsdecode(n)]  # bytes round-trip fsdecode
        self.argv = tuple(argv)
        self.env = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.usable = bool(self.needles) and len(self.needles) >= MIN_NEEDLES
        self.fallbacks = 0  # chunks searched again in Python, for the bench and the tests
        self._proc: runner.Spawned | None = None
        self._writer: threading.Thread | None = None
        self._sent = 0  # bytes written to this grep: its offsets count from its start
        self._rest = b""  # the start of an answer line not read whole yet
        self._rows: deque[bytes] = deque()  # answer lines read, not handled yet
        self._pending = False  # a chunk handed to grep whose answers are not all read

    def __enter__(self) -> GrepLines:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:  # a caller that forgot `close()` still leaves no grep behind
        self.close()

    def close(self) -> None:
        proc, self._proc = getattr(self, "_proc", None), None
        self._pending = False
        if proc is None:
            return
        proc.stop()  # a writer blocked on the pipe gets EPIPE: then the pipes may close
        if self._writer is not None:
            self._writer.join(timeout=5)
        proc.close()

    def __call__(
        self, buf: bytes, needles: Sequence[bytes], *, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        """The lines, as `find_lines` gives them. grep is handed the chunk now, not when
        the lines are first asked for: the caller's own work on the chunk (its line
        count) runs while grep searches it."""
        stop = len(buf) if end is None else end
        if not (self.usable and needles == self.needles) or stop <= start:
            return find_lines(buf, needles, start=start, end=stop)
        try:
            job = self._submit(buf, start, stop)
        except _Broken as e:
            self._broke(e)
            return find_lines(buf, self.needles, start=start, end=stop)
        return self._collect(buf, start, stop, job)

    def _submit(self, buf: bytes, start: int, stop: int) -> _Job:
        """grep and the chunk written to it; the answer line that ends the chunk; grep's
        offset of `buf[0]`."""
        if self._pending:  # the last chunk's answers were never read: that grep is behind
            self.close()
        proc = self._started()
        assert proc.proc.stdin is not None
        piece = memoryview(buf)[start:stop]
        base = self._sent - start  # grep's offset of buf[0]
        end_row = b"%d:%s" % (self._sent + len(piece) + 1, self.mark)
        self._sent += len(piece) + len(self.mark) + 2
        self._writer = threading.Thread(
            target=_write, args=(proc.proc.stdin.fileno(), piece, self.mark), daemon=True
        )
        self._writer.start()
        self._pending = True
        return proc, end_row, base

    def _collect(self, buf: bytes, start: int, stop: int, job: _Job) -> Iterator[bytes]:
        proc, end_row, base = job
        pos = start  # where Python goes on from, should grep fail: after the last line out
        done = False
        try:
            assert proc.proc.stdout is not None and self._writer is not None
            find, rfind, at, known = buf.find, buf.rfind, buf.startswith, self._known
            last_start, last_hit = -1, start
            for row in self._answers(proc.proc.stdout.fileno(), time.monotonic() + TIMEOUT_S):
                if row == end_row:
                    done = True
                    break
                off, sep, needle = row.partition(b":")
                hit = int(off) - base if sep and off.isdigit() else -1
                if not (last_hit <= hit < stop) or needle not in known:
                    raise _Broken(f"grep printed {row[:80]!r}")
                if not at(needle, hit):
                    raise _Broken(f"grep's offset {hit} holds no needle")
                last_hit = hit
                first = max(rfind(b"\n", start, hit) + 1, start)
                if first == last_start:  # another needle on the line just handed on
                    continue
                last = find(b"\n", hit, stop)
                last = stop if last < 0 else last
                last_start, pos = first, last + 1
                yield buf[first:last]
            self._writer.join()
            self._pending = False
        except _Broken as e:
            self._broke(e)
            done = True
            yield from find_lines(buf, self.needles, start=pos, end=stop)
        finally:
            if not done:  # left mid-chunk (the reader stopped): this grep is behind
                self.close()

    def _broke(self, e: _Broken) -> None:
        self.close()  # its stream is out of step with ours: a new grep, or none
        if e.stop:
            self.usable = False  # do not pay a deadline per chunk: the rest is Python's
        self.fallbacks += 1
        if self.fallbacks == 1:
            log.warning("gpuvigil kernel log: %s; searching in Python instead", e)

    def _started(self) -> runner.Spawned:
        if self._proc is None:
            proc = runner.spawn(self.argv, env=self.env)
            if isinstance(proc, str):
                raise _Broken(f"grep could not start ({proc})", stop=True)
            self._proc, self._sent, self._rest = proc, 0, b""
            self._rows.clear()
        return self._proc

    def _answers(self, fd: int, deadline: float) -> Iterator[bytes]:
        """grep's answer lines as they come, until its end or the deadline (`_Broken`).
        Lines read and not taken stay in `_rows` for the next chunk."""
        poll = select.poll()
        poll.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        rows = self._rows
        while True:
            while rows:
                yield rows.popleft()
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(left * 1000 + 1):
                raise _Broken(f"grep gave no answer within {TIMEOUT_S:g} s", stop=True)
            data = os.read(fd, _READ)
            if not data:
                rc = self._proc.proc.poll() if self._proc is not None else None
                raise _Broken(f"grep ended (status {rc})")
            got = (self._rest + data).split(b"\n")
            self._rest = got.pop()
            rows.extend(got)


def _write(fd: int, piece: memoryview, mark: bytes) -> None:
    """The chunk, then the end mark on a line of its own. A grep that is gone (EPIPE)
    ends the write: the reader sees why."""
    try:
        for part in (piece, memoryview(b"\n" + mark + b"\n")):
            left = part
            while left:
                left = left[os.write(fd, left[:_WRITE]) :]
    except OSError:
        pass
