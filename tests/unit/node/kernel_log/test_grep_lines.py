"""grep's multi-string search finds exactly the lines `find_lines` finds, and a grep that is
missing, hangs, crashes or prints what it should not leaves the answer to Python."""

from __future__ import annotations

import io
import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from gpuvigil.node.checks.kernel_log import kernel_log_capture
from gpuvigil.node.checks.kernel_log.grep_lines import GrepLines
from gpuvigil.node.checks.kernel_log.log_lines import LineStats, find_lines, iter_lines

NEEDLES = tuple(kernel_log_capture.needles())


def _log(seed: int, lines: int = 4000) -> bytes:
    rng = random.Random(seed)
    words = [b"kernel: eth0 up", b"systemd[1]: started", b"NVRM: loaded", "é ünïcode".encode()]
    out = []
    for i in range(lines):
        text = rng.choice(words)
        if rng.random() < 0.05:
            n = rng.choice(NEEDLES)
            text = text + b" " + n + b" tail" if rng.random() < 0.5 else n + b" " + text
            if rng.random() < 0.2:  # two needles on one line
                text += b" " + rng.choice(NEEDLES)
        out.append(b"[%8d.000000] " % i + text)
    return b"\n".join(out) + b"\n"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_grep_finds_the_lines_python_finds(seed: int) -> None:
    buf = _log(seed)
    grep = GrepLines(NEEDLES)
    assert grep.usable
    for start, end in ((0, len(buf)), (17, len(buf) - 5), (len(buf) // 3, len(buf) // 2)):
        want = list(find_lines(buf, NEEDLES, start=start, end=end))
        assert list(grep(buf, NEEDLES, start=start, end=end)) == want
    assert grep.fallbacks == 0


def test_iter_lines_with_grep_reads_a_stream_as_without(tmp_path: Path) -> None:
    buf = _log(4, lines=20000)
    a, b = LineStats(), LineStats()
    plain = list(iter_lines(io.BytesIO(buf), NEEDLES, chunk_size=64 * 1024, stats=a))
    fast = list(iter_lines(io.BytesIO(buf), NEEDLES, chunk_size=64 * 1024, stats=b,
                           find=GrepLines(NEEDLES)))  # fmt: skip
    assert plain == fast and plain and a.lines == b.lines


def _fake_grep(tmp_path: Path, body: str) -> str:
    path = tmp_path / "grep"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    "body, disabled",
    [
        ("sleep 30", True),  # hangs: the deadline, then Python for the rest
        ("echo boom >&2; exit 2", False),  # crashes
        ("head -c 1 >/dev/null; echo 12:nonsense", False),  # lies: no needle at that offset
        ("head -c 1 >/dev/null; echo garbage", False),  # prints garbage
        # Waits for the end of its input, which one grep for the whole stream never gets:
        # no answer for the chunk, the deadline, as for a hang.
        ("cat >/dev/null; echo 12:nonsense", True),
        ("kill -9 $$", False),  # killed by a signal
    ],
)
def test_a_broken_grep_leaves_the_answer_to_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, disabled: bool
) -> None:
    from gpuvigil.node.checks.kernel_log import grep_lines

    monkeypatch.setattr(grep_lines, "TIMEOUT_S", 0.5)
    buf = _log(5)
    grep = GrepLines(NEEDLES, binary=_fake_grep(tmp_path, body))
    want = list(find_lines(buf, NEEDLES))
    assert list(grep(buf, NEEDLES)) == want
    assert grep.fallbacks == 1 and grep.usable is not disabled


def test_no_grep_on_the_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    buf = _log(6)
    grep = GrepLines(NEEDLES)
    assert list(grep(buf, NEEDLES)) == list(find_lines(buf, NEEDLES))
    assert not grep.usable  # not tried again
    assert os.environ["PATH"] == str(tmp_path)


def test_one_grep_answers_every_chunk_of_a_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuvigil.io import exec as runner

    started: list[object] = []
    spawn = runner.spawn
    monkeypatch.setattr(runner, "spawn", lambda *a, **k: started.append(a) or spawn(*a, **k))
    buf = _log(7, lines=20000)
    with GrepLines(NEEDLES) as grep:
        got = list(iter_lines(io.BytesIO(buf), NEEDLES, chunk_size=32 * 1024, find=grep))
        assert got == list(iter_lines(io.BytesIO(buf), NEEDLES, chunk_size=32 * 1024))
        assert len(buf) > 10 * 32 * 1024 and len(started) == 1 and grep.fallbacks == 0


def test_a_grep_that_dies_mid_stream_is_started_again(tmp_path: Path) -> None:
    # The first grep reads ~100 kB and ends, half-way through the second chunk: the
    # lines it handed on stand, that chunk's rest is Python's, a new grep does the rest.
    real = shutil.which("grep")
    count = tmp_path / "starts"
    body = (
        f'echo x >> {count}; [ "$(wc -l < {count})" -eq 1 ] && '
        f'{{ dd bs=4096 count=24 2>/dev/null | {real} "$@"; exit; }}; exec {real} "$@"'
    )
    buf = _log(8, lines=20000)
    with GrepLines(NEEDLES, binary=_fake_grep(tmp_path, body)) as grep:
        got = list(iter_lines(io.BytesIO(buf), NEEDLES, chunk_size=64 * 1024, find=grep))
    assert got == list(iter_lines(io.BytesIO(buf), NEEDLES, chunk_size=64 * 1024))
    assert grep.usable and grep.fallbacks == 1 and count.read_text().count("x") == 2


def test_a_reader_that_stops_mid_chunk_leaves_no_grep() -> None:
    buf = _log(9)
    grep = GrepLines(NEEDLES)
    lines = grep(buf, NEEDLES)
    assert next(lines)
    proc = grep._proc
    assert proc is not None and proc.proc.poll() is None
    lines.close()  # the reader had enough: grep is behind, so it goes
    assert grep._proc is None and proc.proc.poll() is not None
    assert list(grep(buf, NEEDLES)) == list(find_lines(buf, NEEDLES))  # a new one answers
    grep.close()


def test_a_chunk_whose_lines_are_never_read_leaves_the_next_one_right() -> None:
    buf = _log(10)
    with GrepLines(NEEDLES) as grep:
        grep(buf, NEEDLES)  # handed to grep, answers never read
        assert list(grep(buf, NEEDLES, start=100)) == list(find_lines(buf, NEEDLES, start=100))
        assert grep.fallbacks == 0
