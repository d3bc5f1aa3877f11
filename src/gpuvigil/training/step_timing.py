"""How long a rank waited for its peers in a step: the part of whole-step time that is not its own.

Called by `run.Run` for straggler detection (`straggler`). In synchronous data parallelism
every rank's step lasts as long as the slowest rank's, so whole-step wall time cannot name
the straggler; what differs is how long each rank *waited*: the slow rank arrives last at
the gradient all-reduce and waits least. `WaitClock` wraps DDP's all-reduce (a comm hook
that calls DDP's own default hook) and measures, per step, from the moment this rank's last
gradient bucket was ready to the moment the all-reduce completed. A rank's **busy time** is
then its whole step wall time (data, forward, backward, optimizer, the collectives' own
transfer time) minus that wait. A rank slow anywhere in its step, backward and optimizer
included, has the longer busy time.

Models DDP does not wrap (FSDP2, pipeline stages), or a DDP model with its own comm hook,
get no wait measurement: their busy time is the whole step (a lockstep job then shows no
straggler; `Run` logs this once).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel


class WaitClock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = 0.0  # when the last bucket of this step was handed to the all-reduce
        self._done = 0.0  # when the last all-reduce of this step completed
        self.attached = False

    def attach(self, model: Any) -> bool:
        """Register the timing hook on a DDP model without one; False when not possible."""
        if not isinstance(model, DistributedDataParallel):
            return False
        clock = self

        def hook(process_group, bucket):  # type: ignore[no-untyped-def]
            # Unannotated on purpose: DDP checks annotations, which `from __future__`
            # turns into strings it does not recognise.
            return clock._hook(process_group, bucket)

        try:
            model.register_comm_hook(state=model.process_group, hook=hook)
        except RuntimeError:  # the user registered a comm hook of their own
            return False
        self.attached = True
        return True

    def _hook(self, process_group: Any, bucket: Any) -> Any:
        now = time.perf_counter()
        with self._lock:
            self._ready = max(self._ready, now)
        fut = default_hooks.allreduce_hook(process_group, bucket)

        def done(f: Any) -> Any:
            t = time.perf_counter()
            with self._lock:
                self._done = max(self._done, t)
            return f.value()

        return fut.then(done)

    def take(self) -> float:
        """Seconds this rank waited in the step just completed (0 when unmeasured)."""
        with self._lock:
            wait = max(0.0, self._done - self._ready) if self._ready else 0.0
            self._ready = self._done = 0.0
        return wait
