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
