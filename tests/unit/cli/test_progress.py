"""Progress bars: on stderr when it is a terminal, silent with --json or when not a terminal
(a pipe, a log file): `simulate` with its stderr on a pseudo-terminal, then on a pipe."""

from __future__ import annotations

import os
import pty
import select
import subprocess

from testkit import cli_env, gpuvigil_argv

SIM = ("simulate", "--scenario", "node", "--nodes", "16", "--days", "2", "--no-storm")


def stderr_on_a_terminal(*args: str) -> tuple[str, str]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(gpuvigil_argv(*args), env=cli_env({"COLUMNS": "100"}),
                            stdout=subprocess.PIPE, stderr=slave, text=True)  # fmt: skip
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(master)
    assert proc.returncode == 0
    return out, seen.decode(errors="replace")


def test_a_terminal_sees_progress() -> None:
    out, err = stderr_on_a_terminal(*SIM)
    assert "node" in err and "100%" in err
    assert "100%" not in out


def test_json_and_pipes_stay_quiet() -> None:
    out, err = stderr_on_a_terminal(*SIM, "--json")
    assert err.strip() == "" and out.lstrip().startswith("{")
    piped = subprocess.run(gpuvigil_argv(*SIM), env=cli_env(), capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert piped.returncode == 0 and piped.stderr == ""
