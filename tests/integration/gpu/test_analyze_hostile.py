"""`gpuvigil analyze` and `logscan` as a user runs them, on hostile inputs: a FIFO with no
writer, `--kmsg <(dmesg)`, closed standard input, a large log, escape sequences. Each
ends in a clear verdict: no silent healthy, no traceback, no hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from testkit import cli_env, gpuvigil_argv

PEAK_OF_CHILD = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(p.returncode)\n"
)
XID79 = "[  812.4] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"


def run(argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=120, **kw)


def test_a_fifo_with_no_writer_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    p = run(gpuvigil_argv("analyze", "--json", "--read-timeout", "1", "--kmsg", str(fifo)))
    assert p.returncode == 2, p.stderr
    (f,) = json.loads(p.stdout)["findings"]
    assert f["code"] == "CHECK_ERROR" and "no data within the read deadline" in f["message"]
    assert time.monotonic() - t0 < 60


def test_kmsg_from_process_substitution(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.txt"
    log.write_text(XID79)
    # bash's <(cat FILE): a pipe in /dev/fd, read once, like `--kmsg <(dmesg)`.
    script = 'f=$1; shift; exec "$@" <(cat "$f")'
    p = run(["bash", "-c", script, "_", str(log), *gpuvigil_argv("analyze", "--json", "--kmsg")])
    assert p.returncode == 1, p.stderr
    assert {f["code"] for f in json.loads(p.stdout)["findings"]} == {"XID_79"}


def test_closed_stdin_is_a_one_line_error() -> None:
    for args in (("analyze", "-"), ("logscan", "-")):
        p = run(["bash", "-c", 'exec "$@" <&-', "_", *gpuvigil_argv(*args)])
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr + p.stdout
        if args[0] == "logscan":
            assert p.stderr.strip().splitlines() == ["gpuvigil logscan: standard input is closed"]
        else:
            assert "standard input is closed" in p.stdout


def test_escape_sequences_are_shown_not_played(tmp_path: Path) -> None:
    # In the log (logscan prints its lines) and in a file name (analyze lists its inputs).
    log = tmp_path / "dmesg\x1b[2J.txt"
    log.write_text(XID79.replace("GPU has", "\x1b]0;owned\x07\x1b[2J GPU has"))
    for argv in (gpuvigil_argv("analyze", str(log)), gpuvigil_argv("logscan", str(log))):
        p = run(argv)
        assert p.returncode == 1, p.stderr
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout
        assert "\\x1b" in p.stdout  # shown as text


def test_a_large_log_is_read_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    block = (
        "[  100.000000] systemd[1]: Started something unremarkable on this node.\n" * 4096
    ).encode()
    with log.open("wb") as f:
        for _ in range(600):  # ~180 MB
            f.write(block)
        f.write(XID79.encode())
    # The peak of the analyze process alone. Not RUSAGE_CHILDREN here (the largest child the
    # session ever reaped), and not wait4 on a child of ours either: Linux carries the
    # forking process's peak across exec, and a late pytest is 400+ MB. A small Python
    # starts analyze and reports its child's peak.
    peak = tmp_path / "peak.kib"
    p = run([sys.executable, "-c", PEAK_OF_CHILD, str(peak),
             *gpuvigil_argv("analyze", "--json", str(log))])  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert {f["code"] for f in json.loads(p.stdout)["findings"]} == {"XID_79"}
    # The interpreter and its imports are most of it; the 180 MB log adds about a chunk.
    peak_kib = int(peak.read_text())
    assert peak_kib < 200 * 1024, peak_kib
