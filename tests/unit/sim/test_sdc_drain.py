"""Issue #22 item 6: a drain of a node with silent data corruption loses the work since the
corruption began. The save on SIGTERM holds wrong results, so the job restarts from the
last checkpoint before the onset, never from what it saved as it left."""

from __future__ import annotations

from typing import Any

from gpuvigil.sim.faults import DEFAULT_KINDS, FaultModel
from gpuvigil.sim.record import EventRecorder
from gpuvigil.sim.run import simulate


class Restarts(EventRecorder):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, float]] = []

    def job_restart(self, t: float, job: Any, *, reason: str, lost_s: float, **kw: Any) -> None:
        self.seen.append((reason, lost_s))
        super().job_restart(t, job, reason=reason, lost_s=lost_s, **kw)


def test_a_drained_corrupted_job_loses_the_work_since_the_corruption() -> None:
    sdc = next(k for k in DEFAULT_KINDS if k.name == "sdc")
    rec = Restarts()
    simulate("full", nodes=64, days=10, seed=1, events=False, recorder=rec,
             model=FaultModel(kinds=(sdc,), scale=5000.0))  # fmt: skip
    drains = [lost for reason, lost in rec.seen if reason.startswith("drain")]
    assert len(drains) >= 10, rec.seen  # the active checks found the corruption and drained
    # before: every one of these saved on SIGTERM and reported 0 s lost
    assert all(lost > 0 for lost in drains), drains
