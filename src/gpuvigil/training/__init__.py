"""Layer 3: training that survives losing a machine (`pip install gpuvigil[training]`).

Read these in order: `run` (the loop API) and `run_state` (what it saves), `process_group`
(restarts that work every time, health gate), `checkpoint` (the agreed save protocol) with
`staging`, `writer`, `dcp_storage`, `state_codec` and `manifest` (async, no pickle, verified),
`resume` (parallel verification, load), `drain` (SIGTERM), `watchdog` and `heartbeat`
(hangs), `launch` and `monitor` (the launcher and its monitor outside the ranks),
`lifecycle` and `journal` (exit records and the job's events), `straggler` and
`straggler_watch` with `step_timing` (busy time), `lightning` (the Lightning callback) with
`loader` (its resumable DataLoader).
Only this package imports torch, and only the modules that need it: `config`, `manifest`,
`straggler`, `watchdog`, `heartbeat`, `lifecycle`, `health_gate`, `storage`, `identity`
and `sampler` are torch-free (the simulator and unit tests import them without torch).
`exit_codes` is `gpuvigil.core.exit_codes`, re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuvigil.core import exit_codes
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.sampler import ResumableSampler

if TYPE_CHECKING:
    from gpuvigil.training.process_group import Env, init, shutdown
    from gpuvigil.training.run import Run

__all__ = ["Env", "ResumableSampler", "Run", "TrainingConfig", "exit_codes", "init", "shutdown"]


def __getattr__(name: str) -> Any:  # torch is imported on first use, not with the package
    if name in {"Env", "init", "shutdown"}:
        from gpuvigil.training import process_group

        return getattr(process_group, name)
    if name == "Run":
        from gpuvigil.training.run import Run

        return Run
    raise AttributeError(name)
