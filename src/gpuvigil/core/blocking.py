"""Which findings take a node out of new work: one table, for both clusters.

The Kubernetes controller's policy (`platform.policy.values.assess`: a node with such a
finding goes SUSPECT, tainted NoSchedule) and Slurm (`node.sinks.slurm.drain_trigger`: the
agent's standalone mode and `gpuvigil slurm-healthcheck` drain the node) both ask
`blocks_new_work`, so a finding Kubernetes blocks on is one Slurm drains on, and no other.

A FAILED finding always blocks, a check that could not run included (fail closed). A
WARNING blocks only where the operator asked for it (`controller.policy.block_on_warning`).
Slurm sites that fear a fleet-wide tool breakage without the controller's circuit breaker
may narrow their drains to fatal findings (`drain_on: fatal`); they never widen them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuvigil.core.verdicts import Status

# status -> (blocks by default, blocks when warnings are asked to block)
BLOCKS: Mapping[Status, tuple[bool, bool]] = MappingProxyType(
    {
        Status.FAILED: (True, True),
        Status.WARNING: (False, True),
        Status.OK: (False, False),
    }
)


def blocks_new_work(status: Status, *, block_on_warning: bool = False) -> bool:
    """Whether a finding with this status takes its node out of new work."""
    default, with_warnings = BLOCKS[status]
    return with_warnings if block_on_warning else default


def blocking_statuses(*, block_on_warning: bool = False) -> frozenset[Status]:
    return frozenset(s for s in BLOCKS if blocks_new_work(s, block_on_warning=block_on_warning))
