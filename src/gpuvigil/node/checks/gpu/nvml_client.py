"""The NVML worker's client: one long-lived `python -m gpuvigil.node.checks.gpu.nvml_worker`
per NVML binding, spoken to in JSON lines, killed (its process group) and replaced when a
request passes its deadline, crashes or prints garbage.

The worker is a long-lived child of ours, not a tool run once, which is why it does not go
through `io.exec.run`; it gets the same care (argv list, own process group, bounded
reads, a deadline on every request). Used by the `gpu` check (`probes.nvml`), the agent
(kept warm across sweeps) and the bench.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpuvigil
from gpuvigil.core.findings import utcnow
from gpuvigil.node.checks.gpu.nvml_readings import inventory_from_lines
from gpuvigil.node.checks.gpu.readings import GpuInventory, ReadError

MAX_LINE = 4 * 1024 * 1024  # one GPU's raw answer is a few KB; bound a runaway worker
START_TIMEOUT_S = 20.0  # interpreter start + import of the binding + nvmlInit


@dataclass
class Answer:
    """The worker's answer to one request, or what went wrong getting it."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None  # None | "timeout" | "crash" | "init"
    detail: str = ""
    init_error: ReadError | None = None
    elapsed_s: float = 0.0
    hung: list[int] = field(default_factory=list)  # GPUs that missed their own deadline


class NvmlClient:
    """One NVML worker process; thread-safe; restarts the worker after a hang or crash."""

    def __init__(self, module: str, *, env: dict[str, str] | None = None) -> None:
        self.module = module
        self.env = dict(os.environ if env is None else env)
        # The worker must import this same gpuvigil (a checkout in tests, site-packages
        # in production), whatever PYTHONPATH the caller had.
        pkg_root = str(Path(gpuvigil.__file__).resolve().parents[1])
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (pkg_root, self.env.get("PYTHONPATH", "")) if p
        )
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._lock = threading.Lock()
        self._stderr: Any = None
        self.starts = 0

    # --- lifecycle ---------------------------------------------------------------------
    def _start(self, deadline: float) -> Answer:
        # Closed in close(): it lives as long as the worker does.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "gpuvigil.node.checks.gpu.nvml_worker", self.module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=self.env,
            start_new_session=True,
        )
        self._buf = b""
        self.starts += 1
        answer = self._read_until(deadline, lambda obj: "ready" in obj or "init_error" in obj)
        if answer.failure:
            self.close()
            return answer
        first = answer.lines[-1]
        if "init_error" in first:
            e = first["init_error"] if isinstance(first["init_error"], dict) else {}
            self.close()
            return Answer(
                failure="init",
                init_error=ReadError("init", str(e.get("name")), str(e.get("message", ""))),
                detail=str(e.get("message", "")),
            )
        return Answer()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in the driver (D state): abandon it
            pass
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # --- requests ----------------------------------------------------------------------
    def request(self, req: dict[str, Any], *, timeout_s: float, per_line: bool = False) -> Answer:
        """Send one request; collect lines until `done`; kill the worker on a deadline.
        `per_line`: the deadline restarts with every line (each GPU gets `timeout_s`)."""
        with self._lock:
            t0 = time.monotonic()
            deadline = t0 + timeout_s
            if self._proc is None or self._proc.poll() is not None:
                self.close()
                started = self._start(min(deadline, t0 + START_TIMEOUT_S))
                if started.failure:
                    started.elapsed_s = time.monotonic() - t0
                    return started
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write((json.dumps(req) + "\n").encode())
                self._proc.stdin.flush()
            except OSError as e:
                self.close()
                return Answer(failure="crash", detail=f"worker pipe: {e}")
            answer = self._read_until(
                deadline, lambda obj: bool(obj.get("done")), per_line_s=timeout_s if per_line else 0
            )
            if answer.failure:
                self.close()
            answer.elapsed_s = time.monotonic() - t0
            return answer

    def _read_until(self, deadline: float, last: Any, *, per_line_s: float = 0) -> Answer:
        assert self._proc is not None and self._proc.stdout is not None
        answer = Answer()
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self._buf:
                    raw, self._buf = self._buf.split(b"\n", 1)
                    try:
                        obj = json.loads(raw)
                    except ValueError:
                        return Answer(
                            answer.lines, "crash", f"worker printed garbage: {raw[:200]!r}"
                        )
                    if isinstance(obj, dict):
                        answer.lines.append(obj)
                        if last(obj):
                            return answer
                        if per_line_s:
                            deadline = time.monotonic() + per_line_s
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return Answer(answer.lines, "timeout", "NVML did not answer in time")
                if not sel.select(timeout=remaining):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return Answer(answer.lines, "crash", f"worker exited: {self._stderr_tail()}")
                self._buf += chunk
                if len(self._buf) > MAX_LINE:
                    return Answer(answer.lines, "crash", "worker line over the size bound")

    def _stderr_tail(self) -> str:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 1000))
        return self._stderr.read().decode("utf-8", errors="replace").strip()

    def snapshot(
        self,
        *,
        timeout_s: float,
        max_links: int = 36,
        budget_s: float | None = None,
        events: bool = False,
    ) -> tuple[GpuInventory, Answer]:
        """Every GPU, each under its own deadline `timeout_s`.

        A GPU that does not answer in time is read as a Timeout of that GPU alone: the
        worker (stuck in the driver on it) is killed and a new one goes on with the next
        GPU, so one hung GPU hides nothing about the others. `budget_s` bounds the whole
        snapshot; GPUs it leaves unread are Timeouts too. A hang before the device count
        (nvmlInit, nvmlDeviceGetCount) is the answer's own failure: no GPU can be named.
        `events`: NVML's pending Xid events come in the same answer (an `events` line),
        asked only of the first worker: registering them touches every GPU, a hung one too.
        """
        observed_at = utcnow()
        end = time.monotonic() + (budget_s if budget_s is not None else 4 * timeout_s)
        lines: list[dict[str, Any]] = []
        hung: list[int] = []
        start, count = 0, None
        while True:
            req = {"op": "snapshot", "max_links": max_links, "start": start}
            answer = self.request(
                req | {"events": events and start == 0},
                timeout_s=min(timeout_s, max(0.05, end - time.monotonic())),
                per_line=True,
            )
            lines += answer.lines
            header = [o["count"] for o in answer.lines if "count" in o and "gpu" not in o]
            if answer.failure != "timeout" or not header or not isinstance(header[0], int):
                break  # done, crashed, or hung before it could name a GPU
            count = header[0]
            answered = [o["gpu"] for o in answer.lines if isinstance(o.get("gpu"), int)]
            stuck = max(answered, default=start - 1) + 1
            hung.append(stuck)
            start = stuck + 1
            if start >= count or time.monotonic() >= end:
                answer = Answer(lines=answer.lines)  # every GPU accounted for, below
                break
        if count is not None:
            # Every GPU gets an answer of its own: the ones that hung, and any the budget
            # left unread (never silently dropped, which would read as missing GPUs).
            read = {o["gpu"] for o in lines if isinstance(o.get("gpu"), int)}
            for i in range(count):
                if i not in read:
                    why = (
                        f"GPU {i} did not answer within {timeout_s:g} s; the NVML worker was "
                        "killed and the other GPUs read by a new one"
                        if i in hung
                        else "not read: the snapshot's time budget ran out on hung GPUs"
                    )
                    lines.append({"gpu": i, "timeout": {"field": "gpu", "message": why}})
        answer.hung = hung
        answer.elapsed_s = (utcnow() - observed_at).total_seconds()
        return inventory_from_lines(lines, observed_at=observed_at), answer


# --- Warm clients, one per (module, scenario), shared by the agent's sweeps ---------------
_clients: dict[tuple[str, str], NvmlClient] = {}
_clients_lock = threading.Lock()


def client_for(module: str, env: dict[str, str]) -> NvmlClient:
    key = (module, env.get("GPUVIGIL_FAKE_NVML_SCENARIO", ""))
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = NvmlClient(module, env=env)
        return c


@atexit.register
def close_all() -> None:
    with _clients_lock:
        for c in _clients.values():
            c.close()
        _clients.clear()
