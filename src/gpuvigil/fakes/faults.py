"""The one list of faults that tests and the simulator inject, and how each changes a node.

`Fault` is the shared vocabulary (the simulator's fault model draws from it; tests name
it); `apply(node, fault, gpu=..., seed=...)` edits a `FakeNode` in place the way that
fault shows up to NVML, nvidia-smi, the kernel log and the fabric fakes. When `gpu` is
None the GPU is drawn from `random.Random(seed)`, so a seeded run injects the same faults.
`clear(node, fault, gpu=...)` undoes what a GPU reset or reboot would repair.
"""

from __future__ import annotations

import random
from enum import StrEnum

from gpuvigil.fakes.gpu import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_THERMAL,
    FakeNode,
    FakeXid,
)


class Fault(StrEnum):
    GPU_OFF_BUS = "gpu_off_bus"  # Xid 79, GPU lost
    ECC_UNCORRECTABLE = "ecc_uncorrectable"  # uncorrected ECC, row remap pending, Xid 94/48
    ROW_REMAP_FAILURE = "row_remap_failure"  # no spare rows left: replace
    NVLINK_DOWN = "nvlink_down"
    NVLINK_ERRORS = "nvlink_errors"  # CRC / replay / recovery counters rising
    THERMAL_SLOWDOWN = "thermal_slowdown"
    HW_SLOWDOWN = "hw_slowdown"
    POWER_BRAKE = "power_brake"
    PCIE_DEGRADED = "pcie_degraded"  # link trained below max width
    EFA_MISSING = "efa_missing"  # an adapter absent from the PCI bus
    EFA_DOWN = "efa_down"  # an adapter present, its link down
    SDC = "sdc"  # silent data corruption: healthy to NVML, wrong results
    APP_XID_13 = "app_xid_13"  # graphics engine exception (usually the application)
    APP_XID_31 = "app_xid_31"  # GPU memory page fault (usually the application)
    APP_XID_43 = "app_xid_43"  # GPU stopped processing (usually the application)
    BOOT_NOISE = "boot_noise"  # an Xid logged at driver load on a healthy GPU
    TOOL_HANG = "tool_hang"  # NVML calls / tools block
    TOOL_MISSING = "tool_missing"  # a tool is not installed
    DRIVER_UNAVAILABLE = "driver_unavailable"  # NVML cannot initialise


# Xid codes carried by the faults (NVIDIA Xid catalog).
XID_FALLEN_OFF_BUS = 79
XID_UNCONTAINED_ECC = 95
XID_CONTAINED_ECC = 94
XID_DBE = 48
XID_ROW_REMAP_FAILURE = 64
# Which Xid a healthy boot logs depends on the family and the catalog; this one is only an
# example code for the fake (the catalog, not the fake, decides what counts as noise).
BOOT_NOISE_XID = 61

_APP_XIDS = {Fault.APP_XID_13: 13, Fault.APP_XID_31: 31, Fault.APP_XID_43: 43}

# Faults that touch one GPU (the others are node-wide).
PER_GPU = frozenset(
    {
        Fault.GPU_OFF_BUS,
        Fault.ECC_UNCORRECTABLE,
        Fault.ROW_REMAP_FAILURE,
        Fault.NVLINK_DOWN,
        Fault.NVLINK_ERRORS,
        Fault.THERMAL_SLOWDOWN,
        Fault.HW_SLOWDOWN,
        Fault.POWER_BRAKE,
        Fault.PCIE_DEGRADED,
        Fault.SDC,
        Fault.APP_XID_13,
        Fault.APP_XID_31,
        Fault.APP_XID_43,
        Fault.BOOT_NOISE,
        Fault.TOOL_HANG,
    }
)


def pick_gpu(node: FakeNode, *, seed: int = 0) -> int:
    indexes = [g.index for g in node.gpus]
    if not indexes:
        raise ValueError("the node has no GPUs")
    return random.Random(seed).choice(indexes)


def apply(
    node: FakeNode,
    fault: Fault,
    *,
    gpu: int | None = None,
    seed: int = 0,
    tool: str = "nvidia-smi",
) -> FakeNode:
    """Inject `fault` into `node` (in place; returned for chaining).

    `tool` names the tool for TOOL_MISSING (and, besides NVML, TOOL_HANG).
    """
    fault = Fault(fault)
    if fault in PER_GPU:
        g = node.gpu(pick_gpu(node, seed=seed) if gpu is None else gpu)
    if fault is Fault.GPU_OFF_BUS:
        g.lost = True
        g.xids.append(FakeXid(XID_FALLEN_OFF_BUS))
    elif fault is Fault.ECC_UNCORRECTABLE:
        g.ecc_volatile_uncorrected += 1
        g.ecc_aggregate_uncorrected += 1
        if g.remap_supported:
            g.remap_uncorrected += 1
            g.remap_pending = True
            g.xids.append(FakeXid(XID_CONTAINED_ECC))
        else:
            g.retired_dbe.append(0x1F000 + len(g.retired_dbe))
            g.retired_pending = True
            g.xids.append(FakeXid(XID_DBE))
    elif fault is Fault.ROW_REMAP_FAILURE:
        g.remap_failure = True
        g.remap_uncorrected += 1
        g.ecc_volatile_uncorrected += 1
        g.ecc_aggregate_uncorrected += 1
        g.xids.append(FakeXid(XID_ROW_REMAP_FAILURE))
    elif fault is Fault.NVLINK_DOWN:
        if g.nvlinks:
            g.nvlinks[random.Random(seed).randrange(len(g.nvlinks))].active = False
    elif fault is Fault.NVLINK_ERRORS:
        for link in g.nvlinks[:2]:
            link.crc_flit += 5000
            link.replay += 500
            link.recovery += 3
    elif fault is Fault.THERMAL_SLOWDOWN:
        g.temperature_gpu_c = g.slowdown_threshold_c + 2
        g.clock_event_reasons = (
            (g.clock_event_reasons & ~CLOCK_GPU_IDLE)
            | CLOCK_SW_THERMAL
            | CLOCK_HW_THERMAL
            | CLOCK_HW_SLOWDOWN
        )
    elif fault is Fault.HW_SLOWDOWN:
        g.clock_event_reasons = (g.clock_event_reasons & ~CLOCK_GPU_IDLE) | CLOCK_HW_SLOWDOWN
    elif fault is Fault.POWER_BRAKE:
        g.clock_event_reasons = (
            (g.clock_event_reasons & ~CLOCK_GPU_IDLE) | CLOCK_HW_SLOWDOWN | CLOCK_HW_POWER_BRAKE
        )
    elif fault is Fault.PCIE_DEGRADED:
        g.pcie_width = max(1, g.pcie_width_max // 2)
    elif fault is Fault.EFA_MISSING:
        node.adapters_missing += 1
    elif fault is Fault.EFA_DOWN:
        down = random.Random(seed).randrange(max(1, node.adapters_expected))
        if down not in node.adapters_down:
            node.adapters_down.append(down)
    elif fault is Fault.SDC:
        g.sdc = True
    elif fault in _APP_XIDS:
        g.xids.append(FakeXid(_APP_XIDS[fault]))
    elif fault is Fault.BOOT_NOISE:
        g.xids.append(FakeXid(BOOT_NOISE_XID, boot=True))
    elif fault is Fault.TOOL_HANG:
        g.hang = True
        node.tools[tool] = "hang"
    elif fault is Fault.TOOL_MISSING:
        node.tools[tool] = "missing"
    elif fault is Fault.DRIVER_UNAVAILABLE:
        node.driver_loaded = False
    return node


def reset_gpu(node: FakeNode, index: int) -> FakeNode:
    """What a GPU reset repairs: volatile ECC, pending remaps/retirements, link training,
    a hung or lost GPU that is still on the bus. Lifetime counters and a failed remap stay."""
    g = node.gpu(index)
    g.ecc_volatile_corrected = g.ecc_volatile_uncorrected = 0
    g.remap_pending = g.retired_pending = False
    g.lost = g.hang = False
    g.errors.clear()
    for link in g.nvlinks:
        link.active = True
    g.clock_event_reasons = CLOCK_GPU_IDLE
    return node


def reboot(node: FakeNode) -> FakeNode:
    """What a reboot repairs: every GPU reset, the driver reloaded, link training redone."""
    for g in node.gpus:
        reset_gpu(node, g.index)
        g.pcie_width = g.pcie_width_max
    node.driver_loaded = True
    node.tools = {k: v for k, v in node.tools.items() if v != "hang"}
    return node
