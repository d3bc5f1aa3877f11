"""Layer 4 inside the simulator: the events a run writes (called by the engine).

`Recorder` is the no-op base (fast runs, the bench); `EventRecorder` builds the real
`gpuvigil.core.events.Event` envelopes, writes them if asked, and feeds layer 4's SLO
tracker and failure attribution as the run goes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpuvigil.core.findings import Finding
    from gpuvigil.sim.jobs import Job
    from gpuvigil.sim.results import Results


class Recorder:
    """Does nothing: the engine calls these hooks at each transition."""

    def findings(self, t: float, node: str, findings: Iterable[Finding]) -> None: ...
    def state(self, t: float, node: str, to: str, reason: str) -> None: ...
    def held(self, t: float, node: str, why: str) -> None: ...
    def remediation(self, t: float, node: str, action: str) -> None: ...
    def submit(self, t: float, job: Job) -> None: ...
    def job_start(self, t: float, job: Job) -> None: ...
    def job_restart(self, t: float, job: Job, *, reason: str, lost_s: float) -> None: ...
    def job_end(self, t: float, job: Job, *, ok: bool, productive_s: float) -> None: ...
    def finish(self, t: float, res: Results) -> None: ...

    def summary(self) -> dict[str, Any]:
        return {}
