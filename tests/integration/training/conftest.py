"""Fixtures for real multi-process training: torchrun (from the venv), gloo, CPU.

`Job` starts `python -m gpuvigil.training.launch --standalone` (torchrun with gpuvigil's
per-node monitor) or plain `python -m torch.distributed.run --standalone`, running
examples/train_resilient.py unchanged through `faulty.py`, which injects the faults of
GV_FAULTS; worker PIDs are recorded in a folder. Teardown SIGTERMs the launcher (never
SIGKILL: its workers live in their own sessions and would be orphaned), then SIGKILLs any
recorded worker still alive.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core.findings import NodeReport
from testkit import cli_env, require

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "train_resilient.py"
FAULTY = Path(__file__).resolve().parent / "faulty.py"
STEPS, EVERY = 24, 4  # every test trains the same job, so all can compare to one baseline


def _torch_ok() -> bool:
    try:
        import numpy  # noqa: F401  (DCP needs it)
        import torch.distributed  # noqa: F401
    except ImportError:
        return False
    return True


class Job:
    def __init__(self, root: Path, name: str, *, state_file: Path) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.ckpt = self.dir / "ckpt"
        self.final = self.dir / "final.pt"
        self.pids = self.dir / "pids"
        self.pids.mkdir()
        self.events = self.dir / "events.jsonl"
        self.log = self.dir / "log.txt"
        self.state_file = state_file
        self.proc: subprocess.Popen[bytes] | None = None

    def start(
        self,
        *,
        nproc: int = 2,
        steps: int = STEPS,
        every: int = EVERY,
        max_restarts: int = 3,
        faults: str = "",
        env: dict[str, str] | None = None,
        ckpt: Path | str | None = None,
        elastic: tuple[str, int] | None = None,
        torchrun: bool = False,
        script: Path = EXAMPLE,
        final: str | None = "final.pt",
        extra: tuple[str, ...] | list[str] = (),
        launch: tuple[str, ...] = (),
    ) -> Job:
        """`elastic=(node, port)`: one agent of a 1-2 node job (c10d rendezvous on the port,
        through `python -m gpuvigil.training.launch`), else a standalone single-node job
        (plain torchrun when `torchrun`, else gpuvigil's launcher)."""
        if elastic is None:
            module = "torch.distributed.run" if torchrun else "gpuvigil.training.launch"
            launcher = [module, "--standalone"]
        else:
            launcher = [
                "gpuvigil.training.launch",
                "--nnodes=1:2",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{elastic[1]}",
                "--rdzv-id=elastic",
                "--rdzv-conf=last_call_timeout=2",
            ]
            env = {**(env or {}), "NODE_NAME": elastic[0], "GPUVIGIL_JOB_ID": "elastic"}
        argv = [
            sys.executable,
            "-m",
            *launcher,
            f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}",
            "--monitor-interval=0.1",
            *launch,
            str(FAULTY),
            str(script),
            "--steps",
            str(steps),
            "--checkpoint-dir",
            str(ckpt or self.ckpt),
            "--checkpoint-every",
            str(every),
            *(["--save-final", str(self.dir / final)] if final else []),
            *extra,
        ]
        extra = {
            "GV_FAULTS": faults,
            "GV_PID_DIR": str(self.pids),
            "GPUVIGIL_EVENTS_FILE": str(self.events),
            "GPUVIGIL__TRAINING__HEALTH_GATE__STATE_FILE": str(self.state_file),
            "GPUVIGIL_JOB_ID": self.dir.name,
            "NODE_NAME": "vm",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        extra.update(env or {})
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=cli_env(extra), cwd=self.dir
            )
        return self

    def wait(self, timeout: float = 120) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"job did not finish in {timeout}s; log:\n{self.text()[-4000:]}")

    def run(self, timeout: float = 120, **kw: Any) -> int:
        return self.start(**kw).wait(timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def storage(self) -> Any:
        from gpuvigil.training.storage import LocalStorage

        return LocalStorage(str(self.ckpt))

    def worker_pid(self, rank: int, attempt: int) -> int | None:
        p = self.pids / f"rank{rank}-attempt{attempt}.pid"
        return int(p.read_text()) if p.exists() else None

    def attempts(self) -> set[int]:
        return {int(p.stem.split("attempt")[1]) for p in self.pids.glob("*.pid")}

    def event_list(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        lines = [json.loads(x) for x in self.events.read_text().splitlines() if x.strip()]
        return [e for e in lines if kind is None or e["kind"] == kind]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in self.pids.glob("*.pid"):
            kill_worker(int(p.read_text()))


def report(*paths: Path) -> dict[str, Any]:
    """`gpuvigil report --json` (layer 4's real code, as a user runs it) over event files."""
    from testkit import gpuvigil_argv

    p = subprocess.run(
        gpuvigil_argv("report", *map(str, paths), "--window", "all", "--json"),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return dict(json.loads(p.stdout))


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def kill_worker(pid: int) -> bool:
    """SIGKILL a recorded worker if it is still our training process (PIDs get reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"train_resilient.py" not in cmdline and b"faulty.py" not in cmdline:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def params_equal(a: Path, b: Path) -> bool:
    import torch

    x, y = torch.load(a), torch.load(b)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(_torch_ok(), "torch and numpy (pip install 'gpuvigil[training]')")
    return tmp_path_factory.mktemp("training")


@pytest.fixture(scope="module")
def healthy_state(workdir: Path) -> Iterator[Path]:
    """A healthy report from the node agent, kept fresh as the agent keeps it (the gate
    refuses a report older than STATE_FILE_MAX_AGE_S, and long jobs restart past it)."""
    import threading

    path = workdir / "node-state.json"
    stop = threading.Event()

    def refresh() -> None:
        while True:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(NodeReport(node="vm").model_dump_json())
            os.replace(tmp, path)
            if stop.wait(20):
                return

    refresh_once = threading.Thread(target=refresh, daemon=True)
    refresh_once.start()
    wait_for(path.exists, timeout=10, what="the node state file")
    yield path
    stop.set()
    refresh_once.join(timeout=5)


@pytest.fixture
def job(workdir: Path, healthy_state: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Job] = []

    def make(name: str | None = None) -> Job:
        j = Job(workdir, name or f"{request.node.name}-{len(made)}", state_file=healthy_state)
        made.append(j)
        return j

    yield make
    for j in made:
        j.stop()


@pytest.fixture(scope="module")
def baseline(workdir: Path, healthy_state: Path) -> Iterator[Job]:
    """The uninterrupted run every fault test must match bit for bit."""
    j = Job(workdir, "baseline", state_file=healthy_state)
    try:
        rc = j.run()
        assert rc == 0, j.text()[-4000:]
        yield j
    finally:
        j.stop()


def wait_for(predicate: Any, *, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)
