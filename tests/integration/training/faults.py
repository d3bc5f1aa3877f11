"""Fault injection into a real training job, driven by GV_FAULTS (tests only, never shipped).

`faulty.py` (the torchrun entry point of the tests) calls `patch()` and then runs the
example unchanged: faults enter through gpuvigil.training's own objects, so the example
stays a script a user can copy. GV_FAULTS is a comma-separated list of
`kind@rank:step[:attempt]` with an optional `=arg`; `attempt` is TORCHELASTIC_RESTART_COUNT
(default 0, `*` any), rank may be `*`:
    kill@1:7         rank 1 SIGKILLs itself at the start of step 7 in attempt 0
    hang@1:5         rank 1 sleeps forever inside step 5
    slow@1:0:*=200   rank 1 sleeps 200 ms in every step from step 0 on, in every attempt
    slowbwd@1:0:*=30 rank 1 sleeps 30 ms inside every backward pass from step 0 on
    hangbwd@1:5      rank 1 sleeps forever inside the backward pass of step 5, before DDP's
                     gradient all-reduce: its stack is in torch, it never enters the collective
    killsave@0:4     rank 0 SIGKILLs itself while committing the checkpoint of step 4
    failsave@*:8     every save from step 8 on fails on that rank (the disk is full)
    killmachine@1:11 rank 1's "machine" dies at the start of step 11: its in-memory tier
                     holder folder (its node's /dev/shm) is wiped, then it SIGKILLs itself
                     (both memtier faults first wait for the copy in flight: the tier holds
                     the step before, as the tests mean)
    damagemem@0:11   rank 0 flips a byte in every copy its memtier holder folder keeps
    raise@0:5        rank 0 raises an exception in step 5 (a bug in the training script)
    term@1:0         rank 1 alone SIGTERMs itself at the start of step 0 (as a node's agent
                     signals only its own workers), at a chosen point instead of a racing one
Scripts that use the Lightning callback get the same faults at the start of each batch
(step = the trainer's global_step; step -1: as training starts, with Lightning's signal
handlers registered and before the callback's on_train_start) and their PID files.
GV_PID_DIR: each worker writes rank<R>-attempt<A>.pid there, for tests that act from outside.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from typing import Any

_faults: list[Fault] = []
_run: list[Any] = []  # the Run, for faults that act on its in-memory tier


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


def _install(run: Any) -> None:
    env = run.env
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if os.environ.get("GV_PID_DIR"):
        path = os.path.join(os.environ["GV_PID_DIR"], f"rank{env.rank}-attempt{attempt}.pid")
        with open(path, "w") as fh:
            fh.write(str(os.getpid()))
    _run[:] = [run]
    _faults[:] = [f for f in parse(os.environ.get("GV_FAULTS", "")) if f.here(env.rank, attempt)]
    for f in _faults:
        if f.kind in ("slowbwd", "hangbwd"):
            _slow_backward(run, f)


def _slow_backward(run: Any, f: Fault) -> None:
    first = next(p for m in run.models for p in m.parameters() if p.requires_grad)

    def hook(grad: Any) -> Any:
        if f.kind == "hangbwd" and run.step == f.step:
            while True:
                time.sleep(3600)
        if f.kind == "slowbwd" and run.step >= f.step:
            time.sleep(f.arg / 1000)
        return grad

    first.register_hook(hook)  # the first layer's gradient comes last in backward


def at_step(step: int) -> None:
    for f in _faults:
        if f.kind == "slow" and step >= f.step:
            time.sleep(f.arg / 1000)
        elif f.step == step and f.kind == "kill":
            logging.info("faults: SIGKILL of this worker at step %d", step)
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.step == step and f.kind == "killmachine":
            logging.info("faults: this rank's machine (process and memtier copies) dies")
            _run[0]._mem.wait()  # the copy of the step before is in place (copies are async)
            shutil.rmtree(_run[0]._mem.holder)
            os.kill(os.getpid(), signal.SIGKILL)
        elif f.step == step and f.kind == "damagemem":
            _run[0]._mem.wait()  # damage the copies the tier holds, not the one being written
            for p in sorted(_run[0]._mem.holder.glob("*.bin")):
                raw = bytearray(p.read_bytes())
                raw[len(raw) // 2] ^= 0xFF
                p.write_bytes(raw)
        elif f.step == step and f.kind == "hang":
            while True:
                time.sleep(3600)
        elif f.step == step and f.kind == "raise":
            raise RuntimeError(f"injected bug at step {step}")
        elif f.step == step and f.kind == "term":
            logging.info("faults: SIGTERM to this worker alone at step %d", step)
            os.kill(os.getpid(), signal.SIGTERM)


def patch(*, lightning: bool = False) -> None:
    """Wrap gpuvigil.training so the faults of GV_FAULTS happen in the job it runs
    (`lightning`: also its Lightning callback; only then is Lightning imported)."""
    if lightning:
        _patch_lightning()
    from gpuvigil.training import checkpoint, manifest
    from gpuvigil.training.run import Run

    enter, steps = Run.__enter__, Run.steps

    def patched_enter(self: Any) -> Any:
        out = enter(self)
        _install(self)
        return out

    def patched_steps(self: Any, total: int) -> Any:
        for step in steps(self, total):
            at_step(step)
            yield step

    Run.__enter__ = patched_enter  # type: ignore[method-assign]
    Run.steps = patched_steps  # type: ignore[method-assign]

    real_commit = checkpoint.commit_point

    def commit_point(storage: Any, folder: str, m: Any) -> None:
        if any(f.kind == "killsave" and f.step == m.step for f in _faults):
            os.kill(os.getpid(), signal.SIGKILL)  # data written, manifest not yet: worst moment
        real_commit(storage, folder, m)

    checkpoint.commit_point = commit_point

    real_sink = checkpoint.Checkpointer._sink

    def sink(self: Any, rel: str, tensors: Any) -> Any:
        step = manifest.step_of(rel.split("/", 1)[0]) or 0
        if any(f.kind == "failsave" and step >= f.step for f in _faults):
            raise OSError(errno.ENOSPC, "No space left on device (injected)", rel)
        return real_sink(self, rel, tensors)

    checkpoint.Checkpointer._sink = sink  # type: ignore[method-assign]


def _patch_lightning() -> None:
    from gpuvigil.training.lightning import Resilience

    setup, train_start = Resilience.setup, Resilience.on_train_start
    batch_start = Resilience.on_train_batch_start

    def patched_setup(self: Any, trainer: Any, pl_module: Any, stage: str) -> None:
        setup(self, trainer, pl_module, stage)
        if stage == "fit":
            _install(self)

    def patched_train_start(self: Any, trainer: Any, pl_module: Any) -> None:
        at_step(-1)
        train_start(self, trainer, pl_module)

    def patched_batch_start(self: Any, trainer: Any, *args: Any) -> None:
        batch_start(self, trainer, *args)
        at_step(trainer.global_step)

    Resilience.setup = patched_setup  # type: ignore[method-assign]
    Resilience.on_train_start = patched_train_start  # type: ignore[method-assign]
    Resilience.on_train_batch_start = patched_batch_start  # type: ignore[method-assign]
