"""A drain that loses nothing: on SIGTERM, finish the step, save, exit with DRAINED (89).

Installed by `run.Run` and by the Lightning callback. Eviction (Kubernetes, a Slurm
preemption) sends SIGTERM; torchrun forwards it to every worker of the node (and waits
`--shutdown-timeout`, torchrun's default 30 s; `python -m gpuvigil.training.launch` sets it
from `monitor.shutdown_timeout_s`). The signal handler only raises a flag. Every rank must
then stop after the *same* step, so that the save, a collective, finds all of them: ranks
agree with one tiny all-reduce (MAX of the flag and of the mean step time) started every K
steps and read at the next check, so it never blocks. K = check_s / step time, agreed from
the all-reduce itself: a check about every 0.1 s of training, whatever the step time, at a
cost no step notices. After a SIGTERM, a rank stops within 2 K steps, about 0.2 s; the
ranks of other nodes, which got no signal, stop at the same step.

Under an in-process restart (`run.Run.keeps_survivors`) the ranks then also learn *which*
of them got the signal (`signalled`: one all-reduce of a flag per rank, once per drain), and
only those leave; the others keep their processes.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Collection
from typing import Any

import torch
import torch.distributed as dist

from gpuvigil.core import exit_codes
from gpuvigil.training import tier_choice
from gpuvigil.training.config import DrainConfig

log = logging.getLogger("gpuvigil.training.drain")

MAX_EVERY = 1000


def peers_stay(signalled: Collection[int], world_size: int, offset: int) -> bool:
    """Whether some rank is drained and every drained rank's in-memory copy is held by a
    rank that stays (its peer, `offset` ranks on: `tier_choice`), so that its replacement
    can fetch it; a drain that takes a rank and its peer together cannot keep the others."""
    gone = set(signalled)
    peers = {tier_choice.peer_of(r, world_size, offset) for r in gone}
    return bool(gone) and len(gone) < world_size and not peers & gone


class Drained(SystemExit):
    """Ends the rank after the drain's checkpoint (exit_codes.DRAINED)."""

    def __init__(self, step: int) -> None:
        super().__init__(exit_codes.DRAINED)
        self.step = step


class Drain:
    def __init__(self, config: DrainConfig, *, world_size: int, group: Any) -> None:
        self.config = config
        self.world_size, self.group = world_size, group
        self.requested = False  # this rank got the signal
        self.signal: int | None = None
        self.agreed_at: int | None = None  # the step after which every rank stops
        self._signalled: list[int] | None = None
        self._previous: Any = None
        self._installed = False
        self._every = 1
        self._next = 1
        self._inflight: tuple[torch.Tensor, Any] | None = None
        self._times = 0.0
        self._count = 0

    def install(self) -> bool:
        """Take SIGTERM (from the main thread only); False when the drain is off."""
        if not self.config.enabled or threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self.handle)
        self._installed = True
        return True

    @property
    def installed(self) -> bool:
        return self._installed

    @property
    def previous(self) -> Any:
        """The SIGTERM handler `install` replaced (restored by `uninstall`)."""
        return self._previous

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def handle(self, signum: int, frame: Any) -> None:
        """The signal handler: only a flag (a collective here would run at whatever point
        each rank is, and deadlock the ranks)."""
        if not self.requested:
            self.requested, self.signal = True, signum
            log.warning(
                "gpuvigil drain: got %s; finishing the step, then saving a checkpoint",
                signal.Signals(signum).name,
            )

    def after_step(self, step: int, step_s: float) -> bool:
        """Called after every completed step; True when every rank stops after this one."""
        if not self.config.enabled:
            return False
        if self.world_size == 1:
            return self.requested
        self._times += step_s
        self._count += 1
        if step < self._next:
            return False
        stop = False
        if self._inflight is not None:
            out, work = self._inflight
            work.wait()
            stop = out[0].item() > 0
            mean = float(out[1].item())
            self._every = max(1, min(MAX_EVERY, int(self.config.check_s / mean))) if mean > 0 else 1
        self._next = step + self._every
        mean_here = self._times / self._count if self._count else 0.0
        self._times, self._count = 0.0, 0
        if stop:
            self._inflight = None
            self.agreed_at = step
            return True
        flag = torch.tensor([1.0 if self.requested else 0.0, mean_here], dtype=torch.float64)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._inflight = (flag, work)
        return False

    def signalled(self) -> list[int]:
        """The ranks whose own process got the signal (`requested` is this rank's). A
        collective the first time: every rank calls it at the agreed step or none does. The
        every-K-steps check carries only the MAX, so that its cost does not grow with the
        world size; this is one all-reduce of a flag per rank, once per drain."""
        if self._signalled is None:
            if self.world_size == 1:
                self._signalled = [0] if self.requested else []
            else:
                flags = torch.zeros(self.world_size, dtype=torch.int32)
                flags[dist.get_rank(self.group)] = 1 if self.requested else 0
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
                self._signalled = [r for r, f in enumerate(flags.tolist()) if f]
        return self._signalled

    def close(self) -> None:
        if self._inflight is not None:  # the last check's all-reduce: every rank issued it
            try:
                self._inflight[1].wait()
            except RuntimeError:
                pass
            self._inflight = None
        self.uninstall()
