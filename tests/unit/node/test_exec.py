"""The fail-closed runner against real subprocesses: good, hang, hanging child, crash,
garbage, 100 MB of output, missing."""

import os
import time
from pathlib import Path

from gpuvigil.node.probes import exec as ex


def test_success_captures_output() -> None:
    r = ex.run(["sh", "-c", "echo out; echo err >&2"])
    assert r.ok and r.text == "out\n" and r.stderr == b"err\n"
    assert ex.failure_finding(r, check="c") is None


def test_missing_binary_is_dependency_missing() -> None:
    r = ex.run(["gpuvigil-no-such-tool", "-q"])
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "DEPENDENCY_MISSING" and f.status == "FAILED"


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    t0 = time.monotonic()
    r = ex.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "CHECK_TIMEOUT"
    child = int(pidfile.read_text())
    time.sleep(0.1)
    try:
        os.kill(child, 0)
        alive = Path(f"/proc/{child}/stat").read_text().split()[2] != "Z"
    except ProcessLookupError:
        alive = False
    assert not alive


def test_nonzero_exit_carries_stderr_tail() -> None:
    r = ex.run(["sh", "-c", "echo boom >&2; exit 3"])
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "CHECK_ERROR" and "boom" in f.message
    assert f.evidence["exit_status"] == 3


def test_output_is_bounded() -> None:
    r = ex.run(["sh", "-c", "head -c 100000000 /dev/zero"], max_output=1 << 20, timeout_s=30)
    assert r.ok and len(r.stdout) == 1 << 20 and r.truncated


def test_crash_by_signal() -> None:
    r = ex.run(["sh", "-c", "kill -SEGV $$"])
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "CHECK_ERROR" and r.returncode == -11
