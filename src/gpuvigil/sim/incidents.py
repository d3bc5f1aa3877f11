"""Incidents the controller must judge right (issue #22): correlated hardware faults, a
flapping machine, a real fault under an open breaker signature, a skewed agent clock.

`Incidents` is mixed into `sim.engine.Engine`; a scenario names one (`Scenario.incident`),
placed a third into the run (at most day 10), and the engine calls `plan_incident` once.
Each incident's faults are real hardware faults of the default model (`fabric_link`,
`gpu_lost`): the node checks, the controller and the cures are the same as for any other
fault; only where and when they strike is the incident's.

- `rack`: EFA down on the 4 nodes of one rack within 30 s (a top-of-rack switch).
- `switch`: EFA down on the 16 nodes of 4 racks under one leaf switch within 30 s.
- `flapping`: one machine's fatal Xid 79 shows for 60 s, is gone for 540 s, and returns,
  for 12 h or until the machine is replaced.
- `held`: the bad-driver storm, and 30 min in, a real `gpu_lost` on a node the bad driver
  reached, while the breaker's signature for that driver is open.
- `skew`: every agent's clock is `SKEW_S` (6 s) ahead of the controller's (its reports
  carry that time), from the start; a third in, a real `gpu_lost` on one node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuvigil.sim.fleet import FaultInstance, Node, NodeState

if TYPE_CHECKING:
    from gpuvigil.sim.engine import Engine

RACK_SPREAD_S = 30.0  # the "within 30 s"
SWITCH_RACKS = 4  # racks under one leaf switch (assumption)
FLAP_ON_S, FLAP_OFF_S, FLAP_FOR_S = 60.0, 540.0, 12 * 3600.0  # the flapping node
HELD_AFTER_S = 1800.0  # the real fault, this long into the storm
SKEW_S = 6.0  # the skew: the tolerance is 5 s
INCIDENTS = ("rack", "switch", "flapping", "held", "skew")
FAULT_EV, FLAP_EV = 0, 17  # sim.engine's FAULT, and the flap's off/on


class Incidents:
    def plan_incident(self: Engine, name: str, at: float) -> None:
        rng = self.draws("incident", name)
        nodes = self.fleet.nodes
        if name in ("rack", "switch"):
            width = self.cfg.rack_nodes * (SWITCH_RACKS if name == "switch" else 1)
            first = rng.randrange(len(nodes) // width) * width
            kind = self.model.by_name["fabric_link"]
            for nid in range(first, min(first + width, len(nodes))):
                onset = at + rng.uniform(0.0, RACK_SPREAD_S)
                self.push(onset, FAULT_EV, self._instance(kind, nid, onset))
        elif name == "flapping":
            node = nodes[rng.randrange(len(nodes))]
            node.flapping_until = at + FLAP_FOR_S
            self.push(at, FLAP_EV, node, 1)
        elif name == "held":
            assert self.storm is not None, "`held` needs the scenario's storm"
            self.held_at = self.storm.at_s + HELD_AFTER_S
            self.push(self.held_at, FLAP_EV, None, 2)
        elif name == "skew":
            nid = rng.randrange(len(nodes))
            kind = self.model.by_name["gpu_lost"]
            self.push(at, FAULT_EV, self._instance(kind, nid, at))

    def on_flap(self: Engine, t: float, obj: Any, what: int) -> None:
        if what == 2:  # `held`: a real fault on a node the bad driver reached
            hit = sorted(self.storm_hit)
            if hit:
                nid = hit[self.draws("incident", "held-node").randrange(len(hit))]
                self.push(t, FAULT_EV, self._instance(self.model.by_name["gpu_lost"], nid, t))
            return
        node: Node = obj
        if t >= node.flapping_until:
            return  # replaced (a new machine), or the flapping is over
        kind = self.model.by_name["gpu_lost"]
        if what == 1:  # on: the fault strikes (if the node is in service to be struck)
            self.push(t, FAULT_EV, self._instance(kind, node.id, t))
            self.push(t + FLAP_ON_S, FLAP_EV, node, 0)
        else:  # off: the GPU is back; the agent's next sweep sees it healthy
            gone = [f for f in node.faults if f.kind is kind]
            if gone and node.state is not NodeState.REPAIR:
                self.flap_off(node, gone, t)
            self.push(t + FLAP_OFF_S, FLAP_EV, node, 1)

    def flap_off(self: Engine, node: Node, gone: list[FaultInstance], t: float) -> None:
        node.faults = [f for f in node.faults if f not in gone]
        node.cleared.add(gone[0].kind.name)
        for fi in gone:
            fi.repaired_s = t
        self.fleet.mark(node, t)
        if self.platform is not None:
            self.platform.at(t)
            if node.faults:
                self.publish(node, t)
            else:
                self.platform.clear(node.name)
                self.control_pass(t)
