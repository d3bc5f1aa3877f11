"""Each rank's heartbeat, read by the per-node monitor outside the rank (`monitor`).

Written by `run.Run` (the step and its time, on every completed step: one `pack_into` on a
shared page, a microsecond) and by the watchdog thread (the current hang timeout, paused or
not). The file lives in the folder the launcher gives its ranks (`GPUVIGIL_RUN_DIR`), one
per local rank; a JSON sidecar says who the rank is and how to reach its attempt's store.
Times are CLOCK_MONOTONIC, one clock for every process of a machine. A rank that is frozen
(SIGSTOP) or hung with its GIL held writes nothing: that silence is what the monitor sees.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_DIR_ENV = "GPUVIGIL_RUN_DIR"
# magic, pid, rank, step, last step (monotonic s), timeout s, paused, started (monotonic s),
# collectives issued on the default group so far (its sequence number; -1: unknown)
_FMT = struct.Struct("<4sIiqddddq")
_MAGIC = b"gvh2"


@dataclass(frozen=True)
class Beat:
    pid: int
    rank: int
    step: int
    last_step_at: float
    timeout_s: float
    paused: bool
    started_at: float
    seq: int = -1  # collectives this rank has entered (the default group's sequence number)


class HeartbeatWriter:
    def __init__(self, run_dir: Path, *, local_rank: int, info: dict[str, Any]) -> None:
        self.path = run_dir / f"local-{local_rank}.hb"
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".local-{local_rank}.hb.tmp"
        with open(tmp, "wb") as fh:
            fh.write(b"\0" * _FMT.size)
        os.replace(tmp, self.path)
        self._fh = open(self.path, "r+b")  # noqa: SIM115 (kept open: the map needs it)
        self._map = mmap.mmap(self._fh.fileno(), _FMT.size)
        self._pid, self._rank = os.getpid(), int(info["rank"])
        side = run_dir / f"local-{local_rank}.json"
        side.write_text(json.dumps({**info, "pid": self._pid}))
        self._timeout, self._paused, self._step, self._last = 0.0, 0.0, 0, 0.0
        self._started = 0.0
        self._seq = -1

    def _write(self) -> None:
        _FMT.pack_into(
            self._map,
            0,
            _MAGIC,
            self._pid,
            self._rank,
            self._step,
            self._last,
            self._timeout,
            self._paused,
            self._started,
            self._seq,
        )

    def start(self, now: float, timeout_s: float) -> None:
        self._started = self._last = now
        self._timeout = timeout_s
        self._write()

    def step(self, step: int, now: float) -> None:
        self._step, self._last = step, now
        self._write()

    def state(self, *, timeout_s: float, paused: bool, now: float, seq: int = -1) -> None:
        self._timeout, self._paused = timeout_s, 1.0 if paused else 0.0
        self._seq = seq
        if paused:
            self._last = now  # a pause is legitimate work: the clock restarts after it
        self._write()

    def finish(self) -> None:
        """The loop is over: what follows (a final save, shutdown) is not watched."""
        self._timeout = 0.0
        self._write()

    def close(self) -> None:
        self._map.close()
        self._fh.close()


def read(path: Path) -> Beat | None:
    """The latest beat in `path`, or None (missing, torn or foreign file: never raises)."""
    try:
        raw = path.read_bytes()[: _FMT.size]
        magic, pid, rank, step, last, timeout, paused, started, seq = _FMT.unpack(raw)
    except (OSError, struct.error):
        return None
    if magic != _MAGIC:
        return None
    return Beat(pid, rank, step, last, timeout, paused > 0, started, seq)


def info(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
