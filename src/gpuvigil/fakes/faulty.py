"""A simulated node carrying one fault, as every health domain's fake reads it.

The simulator (`sim.hardware`) builds one `FaultyNode` per fault name and GPU and hands it
to each domain's fake (`node/checks/<domain>/fake.py`, named by `DOMAIN.fake`), which
returns what that domain's probes would read of it: `Seen`, readings for the domain's
rules, or nothing for a fault its probes do not see. The simulator names no domain.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from gpuvigil.fakes import faults as fake_faults
from gpuvigil.fakes.faults import Fault
from gpuvigil.fakes.gpu import FakeNode, make_node

if TYPE_CHECKING:
    from gpuvigil.node.config import NodeConfig

GPUS = 8  # the simulated fleet's nodes: 8 H100s
MODEL = "H100"


@dataclass(frozen=True)
class Seen:
    """One check's readings of a faulty node. `config`: the node config that check runs
    with when the fake node differs from the fleet's (a fabric fake with fewer adapters);
    None: the fleet's."""

    check: str
    readings: tuple[object, ...]
    config: NodeConfig | None = None


@dataclass(frozen=True)
class FaultyNode:
    """`fault`: the simulator's fault name (`sim.faults`: a `Fault` in either case,
    `XID_<n>`, `SRAM_ECC`, ...); `gpu`: the GPU the fault model drew (node-wide faults
    ignore it); `config`: the fleet's node config; `now`, `booted`: the readings' clock."""

    fault: str
    gpu: int
    config: NodeConfig
    now: datetime
    booted: datetime

    @functools.cached_property
    def injected(self) -> Fault | None:
        """The shared fakes' `Fault` of this name, or None (an Xid-only or a new domain's
        fault, which the fakes do not carry)."""
        try:
            return Fault(self.fault.lower())
        except ValueError:
            return None

    @functools.cached_property
    def node(self) -> FakeNode:
        """The fake GPU node with `injected` applied (healthy when there is none)."""
        node = make_node(GPUS, model=MODEL)
        if self.injected is not None:
            fake_faults.apply(node, self.injected, gpu=self.gpu, seed=0)
        return node
