"""The simulator's `gpu` readings (`DOMAIN.fake`): the fake H100 node with the fault
applied, read through the fake NVML by the real NVML worker's reader (in this process) and
turned into a GpuInventory by `nvml_readings.inventory_from_lines`. Imported only by the
simulator and tests (`domain.FAKE_MODULE`)."""

from __future__ import annotations

import functools
from datetime import datetime

from gpuvigil.fakes import nvml as fake_nvml
from gpuvigil.fakes.faulty import GPUS, MODEL, FaultyNode, Seen
from gpuvigil.fakes.gpu import FakeNode, make_node
from gpuvigil.node.checks.gpu.nvml_readings import inventory_from_lines
from gpuvigil.node.checks.gpu.nvml_worker import Worker
from gpuvigil.node.checks.gpu.readings import ExpectedGpus, GpuInventory, GpuRef


def readings(node: FaultyNode) -> list[Seen]:
    """What the `gpu` check reads of a node carrying a fault the fake GPUs carry."""
    if node.injected is None:
        return []
    inv = nvml_inventory(node.node, now=node.now)
    return [Seen("gpu", (inv, ExpectedGpus(GPUS, "sim")))]


def nvml_inventory(node: FakeNode, *, now: datetime) -> GpuInventory:
    """The snapshot the agent's NVML worker would take of `node`, read in-process."""
    fake_nvml.install(node)
    try:
        fake_nvml.nvmlInit()
        worker = Worker(fake_nvml)
        count = worker.call(fake_nvml.nvmlDeviceGetCount)
        lines = [worker.gpu(i, 36) for i in range(count if isinstance(count, int) else 0)]
        driver = worker.call(fake_nvml.nvmlSystemGetDriverVersion)
        lines.append({"done": True, "count": count, "driver_version": driver})
        fake_nvml.nvmlShutdown()
    finally:
        fake_nvml.install(None)
    return inventory_from_lines(lines, observed_at=now)


def gpu_map(node: FaultyNode) -> dict[str, GpuRef]:
    """The Xid rules' GPU map of the faulty node: the agent's last sweep saw the node
    healthy, so a GPU lost since keeps its bus id."""
    return nvml_inventory(node.node, now=node.now).gpu_map(known=_healthy_map(node.now))


@functools.cache
def _healthy_map(now: datetime) -> dict[str, GpuRef]:
    """The GPU map from a sweep of the healthy node (before any fault)."""
    return nvml_inventory(make_node(GPUS, model=MODEL), now=now).gpu_map()
