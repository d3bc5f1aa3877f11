"""The fail-closed runner against real subprocesses: good, hang, hanging child, crash,
garbage, 100 MB of output, missing."""

import os
import time
from pathlib import Path

from gpuvigil.io import exec as ex


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
    assert len(r.stdout) == 1 << 20 and r.truncated and not r.exited


def test_output_over_the_bound_cannot_be_judged() -> None:
    """A healthy-looking first line plus padding past the cap is not a healthy answer."""
    r = ex.run(["sh", "-c", "echo 'Health: Pass'; head -c 2000000 /dev/zero | tr '\\0' x"],
               max_output=1 << 20, timeout_s=30)  # fmt: skip
    assert r.returncode == 0 and r.text.startswith("Health: Pass")
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "CHECK_ERROR" and f.could_not_run
    assert f.evidence["output_truncated"] is True


def test_output_then_death_by_signal_is_check_error() -> None:
    r = ex.run(["sh", "-c", "echo '<nvidia_smi_log>all fine</nvidia_smi_log>'; kill -KILL $$"])
    assert r.text.startswith("<nvidia_smi_log>") and not r.exited
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "CHECK_ERROR" and "SIGKILL" in f.message


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, within_s: float = 5.0) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_setsid_grandchild_dies_at_the_deadline(tmp_path: Path) -> None:
    """The tool starts a grandchild in a session of its own (out of the tool's process
    group), then hangs: at the deadline both die, the escaped grandchild too."""
    pidfile = tmp_path / "grandchild.pid"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 60"
    r = ex.run(["sh", "-c", script], timeout_s=1.0)
    assert r.error == "timeout"
    gc = int(pidfile.read_text())
    assert _wait_gone(gc), f"setsid grandchild {gc} survived the deadline"


def _in_a_fresh_process(code: str) -> str:
    """Run `code` in a new Python (this checkout's gpuvigil): the subreaper setting is
    for the life of a process, and this test session must not become one."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(ex.__file__).parents[3])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_daemon_left_behind_after_a_clean_exit_is_killed(tmp_path: Path) -> None:
    """The tool daemonises a helper with setsid and exits 0: the helper, re-parented to
    the agent's process (a child subreaper), is found by its run mark and killed."""
    pidfile = tmp_path / "daemon.pid"
    # A real daemon lets go of its stdio (else the run waits for the pipe's end).
    detached = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' </dev/null >/dev/null 2>&1"
    script = f"{detached} & sleep 0.3; exit 0"
    out = _in_a_fresh_process(
        "from gpuvigil.io import exec as ex\n"
        "assert ex.become_subreaper()\n"
        f"print(ex.run(['sh', '-c', {script!r}], timeout_s=10).ok)\n"
    )
    assert out == "True"
    daemon = int(pidfile.read_text())
    assert _wait_gone(daemon), f"daemonised helper {daemon} outlived its tool"


def test_running_a_tool_does_not_make_the_caller_a_subreaper() -> None:
    """Only the agent opts in: a controller or a test session that started daemons of its
    own (slurmd's slurmstepd detaches) must not adopt their orphans (a Slurm job then
    never left COMPLETING on requeue, seen in the Slurm controller test)."""
    out = _in_a_fresh_process(
        "import ctypes\n"
        "from gpuvigil.io import exec as ex\n"
        "assert ex.run(['true']).ok\n"
        "v = ctypes.c_int(-1)\n"
        "ctypes.CDLL(None).prctl(37, ctypes.byref(v), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER\n"
        "print(v.value)\n"
    )
    assert out == "0"


def test_other_children_of_the_runner_are_never_touched(tmp_path: Path) -> None:
    import subprocess

    other = subprocess.Popen(["sleep", "30"])
    try:
        pidfile = tmp_path / "gc.pid"
        ex.run(["sh", "-c", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 60"],
               timeout_s=0.5)  # fmt: skip
        assert _wait_gone(int(pidfile.read_text()))
        assert other.poll() is None and _alive(other.pid)
    finally:
        other.kill()
        other.wait()


def test_crash_by_signal() -> None:
    r = ex.run(["sh", "-c", "kill -SEGV $$"])
    f = ex.failure_finding(r, check="c")
    assert f is not None and f.code == "CHECK_ERROR" and r.returncode == -11


def test_an_escapee_adopted_by_init_dies_at_the_deadline_too(tmp_path: Path) -> None:
    """Not a subreaper (this test session, like `gpuvigil check`): the tool's subshell starts
    a `setsid sleep` and exits at once, so the sleep is re-parented to init (out of the
    tool's tree, session and group); the tool then hangs past its deadline. The sleep is
    found in /proc by the run's mark and killed."""
    pidfile = tmp_path / "escapee.pid"
    escape = f"(setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' </dev/null >/dev/null 2>&1 &)"
    r = ex.run(["sh", "-c", f"{escape}; sleep 60"], timeout_s=1.0)
    assert r.error == "timeout"
    gc = int(pidfile.read_text())
    assert _wait_gone(gc), f"setsid escapee {gc}, adopted by init, survived the deadline"


def test_a_large_input_is_fed_while_the_output_is_read() -> None:
    """8 MiB through `cat`: written whole before reading, cat's full output pipe stopped it
    reading and both sides waited for ever (no deadline covered the write)."""
    import threading

    from gpuvigil.io import exec as runner

    data = bytes(range(256)) * (32 * 1024) + b"\n"
    got: list[runner.ExecResult] = []
    t = threading.Thread(
        target=lambda: got.append(runner.run(["cat"], stdin=data, max_output=16 << 20)),
        daemon=True,
    )
    t.start()
    t.join(30)
    assert got, "run() did not return: the input and output pipes deadlocked"
    assert got[0].ok and got[0].stdout == data
    # a tool that stops reading is not an error of ours; one that hangs still times out
    assert runner.run(["head", "-c", "3"], stdin=data).stdout == data[:3]
    assert runner.run(["sleep", "5"], stdin=data, timeout_s=0.5).error == "timeout"
