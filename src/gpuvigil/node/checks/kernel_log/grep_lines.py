"""The lines of a chunk that hold any of many needles, found by GNU grep's multi-string
search (`grep -F`, one pass for every needle) instead of one `bytes.find` pass per needle.

`analyze` scans a kernel log for ~41 literal markers (the Xid line, the driver load, the
GPU faults, every error phrase). No stdlib tool searches several literals in one pass at
memory speed (docs/performance.md), and 41 passes cost ~9x `logscan`'s one. grep is on
every machine this runs on, and its `-F` with many patterns is one pass over the bytes.

It fails open to the exact answer, never to a wrong one: when grep is missing, exits with
an error, runs past its deadline, is killed, prints more than the bound, or prints an
offset where its needle is not, the chunk is searched again in Python (`find_lines`), and
after a missing binary or a deadline grep is not tried again for this stream. What this
cannot catch: a grep that omits a match it should have printed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence

from gpuvigil.io import exec as runner
from gpuvigil.node.checks.kernel_log.log_lines import find_lines

log = logging.getLogger("gpuvigil.node.kernel_log")

TIMEOUT_S = 10.0  # an 8 MiB chunk takes grep ~20 ms; ten seconds is a stuck tool
# Below this many needles one `bytes.find` pass each is as fast as the process is to start.
MIN_NEEDLES = 4


class GrepLines:
    """A `find_lines` for `log_lines.iter_lines(find=...)`, with grep doing the search."""

    def __init__(self, needles: Sequence[bytes], *, binary: str = "grep") -> None:
        self.needles = tuple(needles)
        argv = [binary, "-F", "-a", "-b", "-o"]
        for n in self.needles:  # argument list, never a shell; bytes round-trip fsdecode
            argv += ["-e", os.fsdecode(n)]
        self.argv = tuple(argv)
        self.env = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        self.usable = bool(self.needles) and len(self.needles) >= MIN_NEEDLES
        self.fallbacks = 0  # chunks searched again in Python, for the bench and the tests

    def __call__(
        self, buf: bytes, needles: Sequence[bytes], *, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        stop = len(buf) if end is None else end
        found = self._grep(buf, start, stop) if self.usable and needles == self.needles else None
        if found is None:
            yield from find_lines(buf, needles, start=start, end=stop)
            return
        yield from found

    def _grep(self, buf: bytes, start: int, stop: int) -> list[bytes] | None:
        piece = bytes(buf[start:stop])
        r = runner.run(self.argv, stdin=piece, timeout_s=TIMEOUT_S, env=self.env,
                       max_output=max(1 << 20, 4 * len(piece)))  # fmt: skip
        if r.error in ("missing", "timeout", "oserror"):
            self.usable = False  # do not pay a deadline per chunk: the rest is Python's
        if not r.exited or r.returncode not in (0, 1):
            return self._fell_back(f"grep: {r.error or r.returncode} {r.stderr_tail(200)}")
        lines: list[bytes] = []
        last_start = -1
        find, rfind = buf.find, buf.rfind
        for row in r.stdout.splitlines():
            off, sep, needle = row.partition(b":")
            if not sep or not off.isdigit():
                return self._fell_back(f"grep printed {row[:80]!r}")
            hit = start + int(off)
            if needle not in self.needles or buf[hit : hit + len(needle)] != needle:
                return self._fell_back(f"grep's offset {hit} holds no needle")
            first = max(rfind(b"\n", start, hit) + 1, start)
            if first <= last_start:  # another needle on the same line
                continue
            end = find(b"\n", hit, stop)
            lines.append(buf[first : stop if end < 0 else end])
            last_start = first
        return lines

    def _fell_back(self, why: str) -> None:
        self.fallbacks += 1
        if self.fallbacks == 1:
            log.warning("gpuvigil kernel log: %s; searching in Python instead", why)
