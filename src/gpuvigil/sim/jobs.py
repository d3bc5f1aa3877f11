"""Gang jobs and the workloads that submit them (the engine starts, slows and restarts them).

A job needs `size` nodes at once, `work_s` seconds of productive time, and checkpoints
every `checkpoint_s` of wall time while it runs. A restart loses the work since the last
checkpoint plus the restart cost (layer-3 semantics, `sim.restart`). Progress is kept as
piecewise-linear segments, so a job costs events only when something happens to it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from enum import StrEnum

HOUR = 3600.0
DAY = 86400.0


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(eq=False)
class Job:
    id: int
    size: int
    work_s: float
    checkpoint_s: float
    submit_s: float
    gpus_per_node: int = 8
    state: JobState = JobState.QUEUED
    nodes: list[int] = field(default_factory=list)
    epoch: int = 0  # bumps on every (re)start and speed change: stale events are ignored
    # progress: constant speed since seg_start, work seg_done at seg_start
    run_start: float = 0.0  # when productive running began (after the restart cost)
    seg_start: float = 0.0
    seg_done: float = 0.0
    speed: float = 1.0
    ckpt_done: float = 0.0  # work secured by the last checkpoint
    alloc_since: float = 0.0
    allocated_s: float = 0.0  # node-seconds held
    started_s: float | None = None  # its first start: ETTR's wall time runs from here
    failures_in_row: int = 0
    interruptions: int = 0
    restarts: int = 0
    hung_since: float | None = None
    in_place: bool = False  # the last restart is torchrun's, on the same nodes (sim.restart)
    # > 0: training's in-memory tier copies every rank's state this often (wall seconds of
    # running; every_steps x the step time), and copy_speed is what the copies leave of it
    memtier_s: float = 0.0
    copy_speed: float = 1.0
    # training.inprocess is on: a crash costs the survivors no restart of their processes
    in_process: bool = False
    from_memory: bool = False  # the next restore reads the in-memory tier, not DCP's files
    end_reason: str = ""

    @property
    def gpus(self) -> int:
        return self.size * self.gpus_per_node

    def done_at(self, t: float) -> float:
        if t <= self.seg_start:
            return self.seg_done
        if self.hung_since is not None:
            t = min(t, max(self.hung_since, self.seg_start))
        return min(self.work_s, self.seg_done + (t - self.seg_start) * self.speed)

    def last_checkpoint(self, t: float, every: float = 0.0) -> float:
        """Wall time of the last checkpoint at or before t (none before run_start), of the
        persistent tier, or of a tier saved `every` seconds (the in-memory one)."""
        every = every or self.checkpoint_s
        if t < self.run_start + every:
            return self.run_start
        k = math.floor((t - self.run_start) / every)
        return self.run_start + k * every

    def secured_at(self, t: float, every: float = 0.0) -> float:
        """Work saved by the last checkpoint at or before t (of the tier saved `every`)."""
        c = self.last_checkpoint(t, every)
        if c <= self.run_start:
            return self.ckpt_done
        if self.hung_since is not None and c > self.hung_since:
            c = self.last_checkpoint(self.hung_since, every)  # a hung job saves nothing
        return max(self.ckpt_done, self.done_at(c)) if c >= self.seg_start else self.ckpt_done

    def rebase(self, t: float, speed: float) -> None:
        """Change speed at t, keeping progress and the last checkpoint."""
        if t > self.run_start:
            self.ckpt_done = self.secured_at(t)
            self.seg_done = self.done_at(t)
            self.seg_start = t
        self.speed = speed
        self.epoch += 1

    def finish_time(self, t: float) -> float:
        start = max(t, self.run_start)
        remaining = self.work_s - self.done_at(start)
        if self.hung_since is not None or self.speed <= 0:
            return math.inf
        return start + remaining / self.speed


@dataclass(frozen=True)
class Workload:
    """How jobs arrive: the sizes, lengths and checkpoint intervals of a fleet's work.

    `mix` weights node counts (most jobs are small: Kokolis et al. 2024); lengths are
    log-uniform in [min_hours, max_hours]; arrivals are Poisson at the rate that keeps
    `utilization` of the fleet busy; the fleet starts full.
    """

    name: str = "mixed"
    nodes: int = 0  # > 0: the fleet size this workload implies (llama3: 2,048 + spares)
    mix: tuple[tuple[int, float], ...] = (
        (1, 0.40), (2, 0.15), (4, 0.13), (8, 0.11), (16, 0.09),
        (32, 0.06), (64, 0.035), (128, 0.02), (256, 0.005),
    )  # fmt: skip
    min_hours: float = 2.0
    max_hours: float = 14 * 24.0
    checkpoint_s: float = 1800.0
    utilization: float = 0.85
    single_job_days: float = 0.0  # > 0: one job on every node for this long (llama3)
    max_failures_in_row: int = 3  # a job that fails this often without progress gives up
    spare_fraction: float = 0.0  # single job: extra idle nodes the job can restart onto
    # > 0: people watch this work and find the host named in a crash this fast on average
    # (a flagship run's on-call team), instead of SimConfig.human_detect_mean_s
    human_detect_mean_s: float = 0.0
    # this share of the fleet's nodes (the last ones) serves an always-on inference
    # Deployment (`sim.serving`) instead of training: one pool of 64 in a fleet of 1,024
    serving_fraction: float = 0.0
    # > 0: training's in-memory tier (training.memtier) copies every this many steps of
    # step_s seconds, where layer 3 runs (sim.restart.arm_memtier)
    memtier_every_steps: int = 0
    step_s: float = 0.0
    in_process: bool = False  # training.restart.in_process, where layer 3 runs

    def initial_and_arrivals(
        self, rng: random.Random, *, nodes: int, horizon_s: float, gpus_per_node: int
    ) -> list[Job]:
        """Every job the run will see, sorted by submit time (ids in that order)."""
        if self.single_job_days > 0:
            work = self.single_job_days * DAY * 10  # longer than the run: it never ends
            size = round(nodes / (1 + self.spare_fraction))
            return [Job(0, size, work, self.checkpoint_s, 0.0, gpus_per_node)]
        sizes = [s for s, _ in self.mix if s <= nodes] or [1]
        weights = [w for s, w in self.mix if s <= nodes] or [1.0]
        lo, hi = math.log(self.min_hours * HOUR), math.log(self.max_hours * HOUR)
        mean_len = (math.exp(hi) - math.exp(lo)) / (hi - lo)
        mean_size = sum(s * w for s, w in zip(sizes, weights, strict=True)) / sum(weights)
        rate = self.utilization * nodes / (mean_size * mean_len)  # jobs per second

        def make(jid: int, t: float) -> Job:
            size = rng.choices(sizes, weights)[0]
            work = math.exp(rng.uniform(lo, hi))
            return Job(jid, size, work, self.checkpoint_s, t, gpus_per_node)

        jobs: list[Job] = []
        t, filled = 0.0, 0
        while filled < self.utilization * nodes:  # start full
            jobs.append(make(len(jobs), 0.0))
            filled += jobs[-1].size
        while True:
            t += rng.expovariate(rate)
            if t >= horizon_s:
                return jobs
            jobs.append(make(len(jobs), t))


WORKLOADS = {
    "mixed": Workload(serving_fraction=0.25),
    # One gang job on every node, checkpointing every 15 min (assumption: Meta does not
    # publish the interval), retried without limit: the Llama 3 405B pre-training setting.
    "llama3": Workload(
        name="llama3",
        single_job_days=54,
        checkpoint_s=900.0,
        max_failures_in_row=10**9,
        spare_fraction=0.0625,
        nodes=2176,
        human_detect_mean_s=1800.0,
        # A step: 6 x 405e9 parameters x 16M tokens over 16,384 GPUs at Meta's reported
        # ~400 TFLOPS a GPU is ~5.9 s. Every 10 steps (59 s) balances a copy's measured
        # training-thread stall (SimConfig.memtier_copy_bytes_per_s: 346 MB in 0.15 s, the
        # snapshot; the rest of the copy, ~1.5 s, runs beside the steps) against the work a
        # loss takes back: sqrt(2 x copy_s / interruption rate) = 57 s at ~450 interruptions
        # in 54 days (8-15 steps give the same ETTR to 0.05 points; 45 steps suited the
        # synchronous copy's 3.5 s).
        memtier_every_steps=10,
        step_s=5.9,
        in_process=True,
    ),
}
