"""A hung NVML worker never outlives the process that started it (even one killed by
SIGKILL, which runs no cleanup)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testkit import cli_env


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_hung_worker_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "worker.pid"
    # The parent starts a worker in its own session (as the NVML client does), then the
    # worker "hangs" in a call (a module whose nvmlInit sleeps), then the parent is killed.
    (tmp_path / "hangnvml.py").write_text(
        "import time\nclass NVMLError(Exception):\n    pass\ndef nvmlInit():\n    time.sleep(600)\n"
    )
    parent_code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'gpuvigil.node.checks.gpu.nvml_worker',"
        " 'hangnvml'], stdin=subprocess.PIPE, stdout=subprocess.PIPE,"
        " start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    env = cli_env({"PYTHONPATH": f"{cli_env()['PYTHONPATH']}{os.pathsep}{tmp_path}"})
    parent = subprocess.Popen([sys.executable, "-c", parent_code], env=env)
    try:
        deadline = time.monotonic() + 20
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        time.sleep(0.5)
        assert _alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=5)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), json.dumps({"worker": worker})
    finally:
        if parent.poll() is None:
            parent.kill()
