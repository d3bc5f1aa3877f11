"""Feeding straggler detection from a running job: busy times, one async all-gather per window.

Owned by `run.Run`. Each completed step adds its busy time (wall time minus the time the
rank waited for its peers, `step_timing`); every `every_steps` steps the window's mean goes
into an all-gather on the monitor side group, started asynchronously and judged when the
next window ends (gloo's threads carry it meanwhile, so no rank waits for its peers here).
Rank 0 reports what `straggler.Detector` finds: a log line, a metric and an event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from gpuvigil.core.events import Kind
from gpuvigil.training import straggler
from gpuvigil.training.step_timing import WaitClock

if TYPE_CHECKING:
    from gpuvigil.training.run import Run

log = logging.getLogger("gpuvigil.training")


class StragglerWatch:
    def __init__(self, run: Run, *, nodes: list[str]) -> None:
        self.run = run
        self.config = run.config.straggler
        self.detector = straggler.Detector(self.config, nodes=nodes)
        self.clock = WaitClock()
        if not any(self.clock.attach(m) for m in run.models) and run.env.rank == 0:
            log.info(
                "gpuvigil straggler: the model is not DDP: busy "
                "time is the whole step, which cannot tell ranks apart in lockstep training"
            )
        self._sum = 0.0
        self._inflight: tuple[int, list[torch.Tensor], Any] | None = None

    def completed(self, step: int, dt: float) -> None:
        self._sum += max(0.0, dt - self.clock.take())
        k = self.config.every_steps
        if step % k:
            return
        previous, self._inflight = self._inflight, None
        env = self.run.env
        out = [torch.zeros(1, dtype=torch.float64) for _ in range(env.world_size)]
        work = dist.all_gather(
            out,
            torch.tensor([self._sum / k], dtype=torch.float64),
            group=env.groups["monitor"],
            async_op=True,
        )
        self._sum = 0.0
        self._inflight = (step, out, work)
        if previous is not None:
            self._judge(*previous)

    def flush(self) -> None:
        """Judge the window still in flight (the loop ended)."""
        if self._inflight is not None:
            self._judge(*self._inflight)
            self._inflight = None

    def close(self) -> None:
        self.clock.detach()
        if self._inflight is not None:  # every rank started it: waiting cannot hang
            try:
                self._inflight[2].wait()
            except RuntimeError:
                pass
            self._inflight = None

    def _judge(self, step: int, out: list[torch.Tensor], work: Any) -> None:
        work.wait()
        found = self.detector.observe([float(t.item()) for t in out], step=step)
        if self.run.env.rank != 0:
            return
        for s in found:
            log.warning(
                "gpuvigil straggler: rank %d on node %s is %.2fx slower than its peers (busy "
                "step time %.1f ms vs median %.1f ms) in %d of the last %d windows of %d "
                "steps, at step %d",
                s.rank,
                s.node,
                s.ratio,
                s.local_s * 1e3,
                s.peers_median_s * 1e3,
                s.windows,
                max(self.config.of_windows, self.config.windows),
                self.config.every_steps,
                s.step,
            )
            self.run.metrics.stragglers.labels(node=s.node).inc()
            self.run.journal.event(
                Kind.STRAGGLER,
                {
                    "rank": s.rank,
                    "ratio": round(s.ratio, 3),
                    "windows": s.windows,
                    "step": s.step,
                    "busy_s": round(s.local_s, 6),
                    "peers_median_s": round(s.peers_median_s, 6),
                },
                node=s.node,
            )
