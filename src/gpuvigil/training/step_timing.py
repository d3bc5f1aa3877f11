"""How long a rank waited for its peers in a step: the part of whole-step time that is not its own.

Called by `run.Run` for straggler detection (`straggler`). In synchronous data parallelism
every rank's step lasts as long as the slowest rank's, so whole-step wall time cannot name
the straggler; what differs is how long each rank *waited*: the slow rank arrives last at
the gradient all-reduce and waits least. `WaitClock` measures, per backward pass, from the
moment this rank's last gradient was ready (a post-accumulate-grad hook on each parameter)
to the end of the backward pass, which DDP's reducer holds until the all-reduce completed
(callbacks queued on the autograd engine run in order; ours is queued behind DDP's). A
rank's **busy time** is its whole step wall time (data, forward, backward, optimizer, the
collectives' own transfer time) minus that wait. A rank slow anywhere in its step,
backward and optimizer included, has the longer busy time.

Why not a DDP comm hook: a Python comm hook replaces DDP's C++ all-reduce path and cost
16% of a small model's step here; these hooks cost one Python call per parameter tensor.
Models without DDP (FSDP2, pipeline stages) get no wait measurement: their busy time is the
whole step (a lockstep job then shows no straggler; `Run` logs this once).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel


def _engine() -> Any:
    return torch.autograd.Variable._execution_engine


class WaitClock:
    def __init__(self) -> None:
        self._n = 0  # gradients per backward pass
        self._seen = 0  # gradients ready so far in this backward pass
        self._ready = 0.0
        self._waited = 0.0  # summed over the backward passes of a step (accumulation)
        self.attached = False
        self._handles: list[Any] = []

    def attach(self, model: Any) -> bool:
        """Time the all-reduce wait of a DDP model; False when it is not DDP."""
        if not isinstance(model, DistributedDataParallel):
            return False
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            self._handles.append(p.register_post_accumulate_grad_hook(self._ready_hook))
        self._n = len(params)
        self.attached = self._n > 0
        return self.attached

    def detach(self) -> None:
        """Remove the hooks: the parameters outlive this Run when an in-process restart
        (`inprocess`) runs the next generation's Run on the same model."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.attached = False

    def _ready_hook(self, _param: torch.Tensor) -> None:
        self._seen += 1
        if self._seen < self._n:
            return
        # The last gradient of this pass. DDP queues its finalize (which waits for the
        # all-reduce) from its own hook on this same gradient, which runs after this one:
        # so this callback queues the one that reads the clock, behind DDP's.
        self._seen = 0
        self._ready = time.perf_counter()
        _engine().queue_callback(self._behind_ddp)

    def _behind_ddp(self) -> None:
        _engine().queue_callback(self._done)

    def _done(self) -> None:
        self._waited += time.perf_counter() - self._ready

    def take(self) -> float:
        """Seconds this rank waited for its peers in the step just completed."""
        waited, self._waited, self._seen = self._waited, 0.0, 0
        return waited
