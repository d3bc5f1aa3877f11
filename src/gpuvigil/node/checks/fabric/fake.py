"""The simulator's `fabric` readings (`DOMAIN.fake`): a fake sysfs tree of a p5-like node
with the EFA fault applied, read by the real fabric probe. Imported only by the simulator
and tests (`domain.FAKE_MODULE`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from gpuvigil.fakes.faults import Fault
from gpuvigil.fakes.faulty import GPUS, FaultyNode, Seen
from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.node.checks.fabric import fabric as fabric_probe
from gpuvigil.node.checks.fabric.readings import NodeInstance

# p5.48xlarge has 32 EFA adapters; 4 give the same verdicts and build 8x faster.
EFA_ADAPTERS = 4


def readings(node: FaultyNode) -> list[Seen]:
    if node.injected not in (Fault.EFA_DOWN, Fault.EFA_MISSING):
        return []
    with tempfile.TemporaryDirectory(prefix="gpuvigil-sim-") as tmp:
        fs = FakeSysfs.node(Path(tmp), gpus=GPUS, kind="efa", adapters=EFA_ADAPTERS)
        first = sorted(fs.pci_of)[0]
        if node.injected is Fault.EFA_DOWN:
            fs.port_down(first)
        else:
            fs.remove_adapter(first)
        reading = fabric_probe.read_fabric(Path(tmp))
    fabric = node.config.fabric.model_copy(update={"kind": "efa", "expect_adapters": EFA_ADAPTERS})
    config = node.config.model_copy(update={"fabric": fabric})
    return [Seen("fabric", (reading, NodeInstance()), config=config)]
