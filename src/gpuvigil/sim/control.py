"""Layer 2 inside the simulator: what the controller does with a node's findings.

Called by the engine when layer 1 reports a node. `Control.plan` answers with a `Plan`:
block new work, drain the running job, which remediation step to take, or hold (budget,
breaker). The disruption budget and the circuit breaker are fleet-wide state kept here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpuvigil.core.findings import Action
from gpuvigil.sim.detect import Verdict

LADDER = (Action.RESET_GPU, Action.REBOOT, Action.REPLACE)


@dataclass(frozen=True)
class Plan:
    block: bool = False  # no new work on the node
    drain: bool = False  # take the running job off now
    step: Action | None = None  # remediation to run (RESET_GPU, REBOOT, REPLACE)
    human: bool = False  # quarantined: a person repairs it
    held: str = ""  # a disruption safety held back (budget, breaker)
    grace_s: float = 0.0  # wait this long before draining (non-fatal problems)
    reason: str = ""


class Control:
    """The controller's decisions for the simulated fleet, with budget and breaker."""

    def __init__(
        self,
        *,
        fleet_size: int,
        breaker: bool = True,
        budget_fraction: float = 0.05,
        breaker_fraction: float = 0.05,
        breaker_window_s: float = 900.0,
        suspect_grace_s: float = 600.0,
    ) -> None:
        self.breaker_enabled = breaker
        self.budget = max(1, int(budget_fraction * fleet_size))
        self.breaker_threshold = max(3, int(breaker_fraction * fleet_size))
        self.window_s = breaker_window_s
        self.grace_s = suspect_grace_s
        self.in_flight: set[int] = set()
        self._recent: deque[tuple[float, int]] = deque()
        self.breaker_open = False
        self.trips = 0

    def _note_failure(self, node: int, t: float) -> None:
        self._recent.append((t, node))
        self._refresh(t)

    def _refresh(self, t: float) -> None:
        while self._recent and self._recent[0][0] < t - self.window_s:
            self._recent.popleft()
        nodes = {n for _, n in self._recent}
        was = self.breaker_open
        self.breaker_open = self.breaker_enabled and len(nodes) >= self.breaker_threshold
        if self.breaker_open and not was:
            self.trips += 1

    def plan(self, node: int, verdict: Verdict, t: float) -> Plan:
        self._refresh(t)
        if not verdict.seen:
            return Plan()
        self._note_failure(node, t)
        if verdict.could_not_run:
            # cannot tell: keep new work off; a reboot usually clears a hung or missing tool
            return self._disrupt(
                node,
                Plan(
                    block=True,
                    drain=True,
                    step=Action.REBOOT,
                    grace_s=self.grace_s,
                    reason="checks cannot run",
                ),
            )
        action = verdict.action
        if action.rank < Action.RESET_GPU.rank:
            return Plan(reason=f"{action.value}: the job's business, not the node's")
        if action is Action.INVESTIGATE:
            return self._disrupt(
                node, Plan(block=True, drain=True, human=True, reason="INVESTIGATE")
            )
        grace = 0.0 if verdict.fatal else self.grace_s
        return self._disrupt(
            node,
            Plan(
                block=True, drain=True, step=action, grace_s=grace, reason=verdict.findings[0].code
            ),
        )

    def _disrupt(self, node: int, plan: Plan) -> Plan:
        if self.breaker_open:
            # hold every disruption; still keep new work off a node with a real problem
            real = plan.reason != "checks cannot run"
            return Plan(block=real, held="circuit breaker open", reason=plan.reason)
        if node not in self.in_flight and len(self.in_flight) >= self.budget:
            return Plan(block=True, held="disruption budget", reason=plan.reason)
        self.in_flight.add(node)
        return plan

    def done(self, node: int) -> None:
        self.in_flight.discard(node)
