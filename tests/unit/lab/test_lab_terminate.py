"""SIGTERM ends `gpuvigil lab` as Ctrl-C does: through `Lab.run`'s `finally`, which stops
the lab's processes (the default action killed it there and left them running)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# what the lab command does around Lab.run: the handler, then a run whose finally cleans up
CHILD = """
import sys, time
from pathlib import Path
from gpuvigil.lab.run import interrupt_on_terminate
interrupt_on_terminate()
out = Path(sys.argv[1])
try:
    out.write_text("running")
    time.sleep(30)
finally:
    out.write_text("stopped")
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_terminate_runs_the_cleanup(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "state"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.read_text() == "running"
    child.send_signal(sig)
    _, err = child.communicate(timeout=20)
    assert out.read_text() == "stopped"
    assert child.returncode != 0  # an interrupted lab is not a passed one
    assert b"KeyboardInterrupt" in err


# the command itself, `gpuvigil lab`, with a Lab whose run only waits in a try/finally (the
# real one needs the control plane): SIGTERM must reach that finally through the command
COMMAND = """
import sys, time
from pathlib import Path
from gpuvigil.lab import control_plane, run

out = Path(sys.argv[1])

class SlowLab:
    def __init__(self, *args, **kwargs):
        pass

    def run(self):
        try:
            out.write_text("running")
            time.sleep(30)
            return []
        finally:
            out.write_text("stopped")

run.Lab = SlowLab
control_plane.missing = lambda: ""
from gpuvigil.cli import main
sys.exit(main(["lab", "--fault", "xid48", "--quiet", "--workdir", sys.argv[2]]))
"""


def test_terminate_reaches_the_lab_commands_cleanup(tmp_path: Path) -> None:
    out = tmp_path / "state"
    child = subprocess.Popen(
        [sys.executable, "-c", COMMAND, str(out), str(tmp_path / "lab")], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.read_text() == "running"
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=20)
    assert out.read_text() == "stopped", err
    assert child.returncode != 0, err
