"""Issue #24 item 4 in the simulator: a gang job with training's in-memory tier loses at
most its copy interval on one lost machine, by `training.tier_choice`'s rule, and pays
each copy's measured cost in speed; two adjacent machines lost at once fall back to the
persistent checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuvigil.sim import restart
from gpuvigil.sim.faults import DEFAULT_KINDS, FaultModel
from gpuvigil.sim.jobs import WORKLOADS, Job
from gpuvigil.sim.record import EventRecorder
from gpuvigil.sim.run import simulate
from gpuvigil.sim.scenarios import SimConfig

EVERY, STEP = 10, 6.0  # a copy every 60 s; the persistent tier every 900 s


class Restarts(EventRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.lost: list[float] = []

    def job_restart(self, t: float, job: Any, *, reason: str, lost_s: float, **kw: Any) -> None:
        if not reason.startswith("drain"):
            self.lost.append(lost_s)
        super().job_restart(t, job, reason=reason, lost_s=lost_s, **kw)


def _run(every: int) -> list[float]:
    gpu_lost = next(k for k in DEFAULT_KINDS if k.name == "gpu_lost")
    wl = dataclasses.replace(WORKLOADS["llama3"], nodes=68, single_job_days=6,
                             memtier_every_steps=every, step_s=STEP)  # fmt: skip
    rec = Restarts()
    simulate("full", workload=wl, seed=3, events=False, recorder=rec,
                   model=FaultModel(kinds=(gpu_lost,), scale=40.0))  # fmt: skip
    return rec.lost


def test_one_lost_machine_costs_at_most_the_copy_interval() -> None:
    with_tier, without = _run(EVERY), _run(0)
    assert len(with_tier) >= 10 and len(without) >= 10
    # the work since the copy; a loss can land while the job still restarts (0 lost)
    assert max(with_tier) <= EVERY * STEP + 1e-6, with_tier
    assert max(without) > EVERY * STEP  # the 15-minute persistent tier


def test_two_neighbouring_machines_lose_the_tier_and_a_copy_costs_speed() -> None:
    job = Job(0, size=4, work_s=1e9, checkpoint_s=900.0, submit_s=0.0, gpus_per_node=8)
    cfg = SimConfig()
    restart.arm_memtier(job, cfg, every_steps=EVERY, step_s=STEP)
    copy_s = cfg.checkpoint_bytes_per_rank / cfg.memtier_copy_bytes_per_s
    assert job.copy_speed == EVERY * STEP / (EVERY * STEP + copy_s) < 1.0
    assert restart.memory_tier_holds(job, [2])
    assert restart.memory_tier_holds(job, [0, 2])
    assert not restart.memory_tier_holds(job, [1, 2])  # node 2 holds node 1's copies
    assert not restart.memory_tier_holds(job, [3, 0])  # the ring wraps
    assert not restart.memory_tier_holds(Job(1, 4, 1e9, 900.0, 0.0), [2])  # no tier
