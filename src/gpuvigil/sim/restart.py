"""Layer-3 restart semantics inside the simulator (called by `sim.lifecycle`).

A restart loses the work since the last checkpoint plus the restart cost; layer 3's warm
restart (in-job, on the same allocation) costs less than a requeue.
"""

from __future__ import annotations

from gpuvigil.sim.scenarios import SimConfig


def restart_cost_s(config: SimConfig, *, warm: bool) -> float:
    return config.warm_restart_cost_s if warm else config.restart_cost_s
