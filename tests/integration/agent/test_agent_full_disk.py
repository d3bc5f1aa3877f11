"""A full disk says so (issue #21 item 9), with a real failing write: the agent's state file
lives on a 4 MiB tmpfs that is then filled up (as root; elsewhere its folder is made
read-only, which refuses a non-root writer just as really). The old report must not go on
saying what the agent no longer knows: it is removed, `/healthz` fails within one publish
interval, and `gpuvigil slurm-healthcheck` exits non-zero naming the missing report. Once
there is room again, the report and a healthy /healthz come back."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import agent_helpers
from agent_helpers import cli_env, gpuvigil_argv, http_get, wait_until

from gpuvigil.fakes.gpu import SCENARIO_ENV

start_agent = agent_helpers.start_agent  # the fixture
INTERVAL_S = 1.0  # publish_interval_s: the agent writes its report at least this often


@contextlib.contextmanager
def small_disk(folder: Path) -> Iterator[bool]:
    """A 4 MiB tmpfs at `folder` (True), or, without the right to mount, a plain folder
    (False: the test makes it read-only instead)."""
    folder.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(folder)],
        capture_output=True, timeout=30, check=False,
    ).returncode == 0  # fmt: skip
    try:
        yield mounted
    finally:
        folder.chmod(0o755)
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30,
                           check=False)  # fmt: skip


class Filler(threading.Thread):
    """Keeps the filesystem full: appends to one file until ENOSPC, and again whenever room
    appears (the agent's removed report frees its blocks, and a disk that a runaway log
    fills stays full), until stopped; then frees it all."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.halt, self.full = folder / "filler", threading.Event(), threading.Event()

    def run(self) -> None:
        with self.path.open("ab", buffering=0) as fh:
            while not self.halt.is_set():
                try:
                    fh.write(b"\0" * 4096)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    self.full.set()
                    self.halt.wait(0.002)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)
        self.path.unlink()


def test_a_full_disk_removes_the_report_and_fails_healthz(start_agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with small_disk(tmp_path / "run") as mounted:
        state = tmp_path / "run" / "report.json"
        cfg = {"agent": {"publish_interval_s": INTERVAL_S}}
        a = start_agent(cfg, "--state-file", str(state), "--sink", "state-file",
                        "--sink", "http", "--interval", "1", wait_ready=False)  # fmt: skip
        wait_until(state.exists, 90, "the agent's first report")
        wait_until(lambda: http_get(a.url + "/healthz")[0] == 200, 60, "a healthy agent")
        json.loads(state.read_text())  # a whole report

        filler = Filler(state.parent)
        if mounted:
            filler.start()
            assert filler.full.wait(30), "the tmpfs never filled"
        else:
            state.parent.chmod(0o555)  # a non-root writer is refused: EACCES
        broke = time.monotonic()

        def unhealthy() -> dict | None:
            code, body = http_get(a.url + "/healthz")
            return json.loads(body) if code == 503 else None

        body = wait_until(unhealthy, 30, "/healthz to fail", every=0.05)
        took = time.monotonic() - broke
        print(f"/healthz 503 {took:.2f} s after the disk filled (interval {INTERVAL_S} s)")
        assert "state_file" in body["sinks_failing_s"], body
        assert not state.exists(), "the old report is still there, saying what is no longer known"
        assert took < 2 * INTERVAL_S + 1, took  # within one interval (+ polling and load)

        r = subprocess.run(
            gpuvigil_argv("slurm-healthcheck", "--node-name", "gpu-test-1", "--no-drain",
                          "--state-file", str(state), "--config", str(tmp_path / "agent-0.yaml")),
            env=cli_env({SCENARIO_ENV: str(a.machine.scenario)}),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert r.returncode != 0, r.stdout + r.stderr
        assert "FAILED RESULT_STALE agent" in r.stdout and "missing" in r.stdout, r.stdout

        if mounted:
            filler.stop()
        else:
            state.parent.chmod(0o755)
        wait_until(state.exists, 30, "the report to come back once there is room")
        wait_until(lambda: http_get(a.url + "/healthz")[0] == 200, 30, "/healthz to recover")
        a.stop()
