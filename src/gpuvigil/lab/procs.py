"""Processes the lab starts: each in its own session with its log file, stopped by PID
(its whole process group), never by name. Readiness is polled with a deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class Proc:
    """A process with its log file; `stop()` signals its whole process group."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._logf = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            user=user,
        )
        self._seen: set[tuple[int, int]] = set()  # (pid, start time) of its descendants
        self._remembered_at = 0.0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def send(self, sig: int) -> None:
        """Signal the process itself (as a container runtime signals PID 1)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.popen.pid, sig)

    def remember(self, *, every_s: float = 0.0) -> None:
        """Note every process below this one now: a child whose parent dies is adopted by
        init, and would escape `kill_all` unless it was seen before (the lab calls this
        on its passes, as a cgroup would hold them all). `every_s`: at most this often (a
        scan reads every process's /proc entry)."""
        now = time.monotonic()
        if every_s and now - self._remembered_at < every_s:
            return
        self._remembered_at = now
        for pid in descendants(self.popen.pid):
            started = _start_time(pid)
            if started is not None:
                self._seen.add((pid, started))

    def kill_all(self) -> None:
        """SIGKILL the process and everything it started, as a runtime kills a container's
        cgroup: its group and every descendant, also those in sessions of their own
        (torchrun starts its workers so) and those orphaned since `remember` saw them."""
        self.remember()
        for pid, started in sorted(self._seen):
            if _start_time(pid) == started:  # the same process, not a reused pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int | None:
        """`sig`, then SIGKILL of the whole tree after `timeout` seconds."""
        self.remember()
        if self.alive():
            self.send(sig)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        if not self._logf.closed:
            self._logf.close()
        return self.popen.returncode


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc), children before their own children."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ")".
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def wait_until(
    predicate: Callable[[], object],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "condition",
) -> object:
    """Poll `predicate` until it returns something true; TimeoutError names `what`."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = predicate()
            if got:
                return got
        except Exception as e:  # noqa: BLE001 - a server not up yet raises; keep polling
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}: {last_exc!r}")


def environ(pid: int) -> dict[str, str]:
    """A process's environment (/proc/PID/environ); empty when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def running(marker: bytes, below: int) -> list[int]:
    """Processes under `below` whose command line holds `marker`."""
    out = []
    for pid in descendants(below):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmd:
            out.append(pid)
    return out
