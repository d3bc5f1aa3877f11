"""Fault injection for the example, driven by the GV_FAULTS environment variable (tests only).

Not part of gpuvigil's API. GV_FAULTS is a comma-separated list of `kind@rank:step[:attempt]`
with an optional `=arg`; `attempt` is TORCHELASTIC_RESTART_COUNT (default 0, `*` any), rank
may be `*`:
    kill@1:7        rank 1 SIGKILLs itself at the start of step 7 in attempt 0
    hang@1:5        rank 1 sleeps forever inside step 5
    slow@1:0:*=200  rank 1 sleeps 200 ms in every step from step 0 on, in every attempt
    killsave@0:4    rank 0 SIGKILLs itself while committing the checkpoint of step 4
GV_PID_DIR: each worker writes rank<R>-attempt<A>.pid there, for tests that kill from outside.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

_faults: list[Fault] = []


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: str
    step: int
    attempt: str
    arg: float

    def here(self, rank: int, attempt: int) -> bool:
        return self.rank in ("*", str(rank)) and self.attempt in ("*", str(attempt))


def parse(spec: str) -> list[Fault]:
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        head, _, arg = item.partition("=")
        kind, _, where = head.partition("@")
        rank, step, *attempt = where.split(":")
        out.append(Fault(kind, rank, int(step), attempt[0] if attempt else "0", float(arg or 0)))
    return out


def install(env: Any) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if os.environ.get("GV_PID_DIR"):
        path = os.path.join(os.environ["GV_PID_DIR"], f"rank{env.rank}-attempt{attempt}.pid")
        with open(path, "w") as fh:
            fh.write(str(os.getpid()))
    _faults[:] = [f for f in parse(os.environ.get("GV_FAULTS", "")) if f.here(env.rank, attempt)]
    saves = {f.step for f in _faults if f.kind == "killsave"}
    if saves:
        from gpuvigil.training import checkpoint

        real = checkpoint.commit_point

        def commit_point(storage: Any, folder: str, m: Any) -> None:
            if m.step in saves:  # data written, manifest not yet: the worst moment to die
                os.kill(os.getpid(), signal.SIGKILL)
            real(storage, folder, m)

        checkpoint.commit_point = commit_point


def at_step(step: int) -> None:
    for f in _faults:
        if f.kind == "slow" and step >= f.step:
            time.sleep(f.arg / 1000)
        elif f.step == step and f.kind == "kill":
            logging.info("faults: SIGKILL of this worker at step %d", step)
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.step == step and f.kind == "hang":
            while True:
                time.sleep(3600)
