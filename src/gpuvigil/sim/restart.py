"""Layer-3 restart semantics inside the simulator (called by `sim.lifecycle`).

A restart loses the work since the last checkpoint plus the restart cost. With layer 3
(`full`): the hang watchdog (`training.config.WatchdogConfig`) ends a hung step after
max(min_timeout_s, factor x p99 step time) instead of the collective timeout; a restart is
in place (warm); a drain waits for a checkpoint, so it loses no work; and a worker stopped
for its node (the health gate's `NODE_UNHEALTHY`/`NODE_STATE_UNKNOWN`, or a node fault the
controller drains) exits with a code the job's retry policy does not count against it.
"""

from __future__ import annotations

from gpuvigil.core import exit_codes
from gpuvigil.sim.faults import Cause, Effect
from gpuvigil.sim.fleet import FaultInstance
from gpuvigil.sim.scenarios import SimConfig
from gpuvigil.training.config import WatchdogConfig

# Exit codes a retry policy treats as "the node's fault" (e.g. a Kubernetes Job's
# podFailurePolicy rule with action Ignore): the health gate's two refusals.
NODE_EXIT_CODES = (exit_codes.NODE_UNHEALTHY, exit_codes.NODE_STATE_UNKNOWN)


def restart_cost_s(config: SimConfig, *, warm: bool) -> float:
    return config.warm_restart_cost_s if warm else config.restart_cost_s


def hang_timeout_s(
    config: SimConfig, *, layer3: bool, watchdog: WatchdogConfig | None = None
) -> float:
    """How long a hung job sits before something ends it."""
    if not layer3:
        return config.nccl_timeout_s
    wd = watchdog or WatchdogConfig()
    if wd.timeout_s is not None:
        return wd.timeout_s
    return max(wd.min_timeout_s, wd.factor * config.step_p99_s)


def counts_against_job(fi: FaultInstance | None, *, layer3: bool) -> bool:
    """Does this interruption use up the job's retry budget?"""
    if not layer3 or fi is None:
        return True
    hardware = fi.kind.persistent and fi.kind.cause is not Cause.TOOLING
    return not hardware  # a node fault exits with a node exit code: not the job's failure


def exit_code(fi: FaultInstance | None, *, layer3: bool, graceful: bool) -> int | None:
    """The exit code a restart's workers end with, where the code that ends them sets one:
    layer 3's graceful drain exits DRAINED and its hang watchdog exits HANG; a program that
    crashed on a software fault exits with its own error (1). None where they were killed
    (a dead host, a collective timeout's abort, a drain without layer 3): only other
    evidence can say why (`core.exit_codes`)."""
    if graceful and layer3:
        return exit_codes.DRAINED
    if fi is None:
        return None
    if fi.kind.effect is Effect.HANG:
        return exit_codes.HANG if layer3 else None
    software = not fi.kind.persistent and fi.kind.effect is Effect.CRASH
    return 1 if software else None
