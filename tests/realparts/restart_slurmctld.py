"""Restart a test cluster's slurmctld, as `systemctl restart slurmctld` would on a site:
stop the running one (its pid file), start a fresh one from the same slurm.conf with its
state (`-i`: the fixture's flag). Usage: restart_slurmctld.py SLURM_CONF. Exit 0 once the
new slurmctld is started; 1 when the old one would not stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def _running(pid: int) -> bool:
    """Alive and not a zombie (the test's slurmctld is reaped only by its parent, pytest)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def main(conf: str) -> int:
    text = Path(conf).read_text()
    m = re.search(r"^SlurmctldPidFile=(\S+)", text, re.MULTILINE)
    pidfile = Path(m.group(1)) if m else None
    try:
        pid = int(pidfile.read_text().strip()) if pidfile else 0
    except (OSError, ValueError):
        pid = 0
    if pid and "slurmctld" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 20
        while _running(pid) and time.monotonic() < end:
            time.sleep(0.1)
        if _running(pid):
            return 1
    # Started as systemd would: not one of the caller's processes (gpuvigil's runner ends
    # every process its command leaves behind, found by the GPUVIGIL_RUN mark).
    env = {k: v for k, v in os.environ.items() if k != "GPUVIGIL_RUN"}
    env["SLURM_CONF"] = conf
    subprocess.run(["slurmctld", "-i", "-f", conf], env=env, check=True, timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
