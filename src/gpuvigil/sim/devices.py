"""The world's side of per-GPU isolation in the simulator: what the NVIDIA device plugin
does with a GPU, and which pods hold which GPU (what the kubelet's PodResources API says).

Called by `sim.episodes` (a node's published findings -> the GPUs the plugin takes out of
allocatable) and `sim.platform.SimCluster` (holders). The controller's per-GPU loop is the
real one (`platform.gpu_path`, `platform.isolation`) over the simulated cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuvigil.core.findings import Finding
from gpuvigil.platform.isolation import gpu_index

# The Xids the device plugin treats as the application's, never the device's
# (NVIDIA/k8s-device-plugin internal/rm/health.go); any other Xid it sees as an
# XidCriticalError marks that GPU unhealthy, out of the node's allocatable.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def plugin_marks_out(findings: Iterable[Finding]) -> set[int]:
    """The GPUs the device plugin takes out of allocatable for these findings: those with
    a critical Xid (it watches NVML's Xid events only; an ECC counter or a lost link alone
    it does not act on)."""
    out: set[int] = set()
    for f in findings:
        index = gpu_index(f.component)
        code = f.code.removeprefix("XID_")
        xid = f.code.startswith("XID_") and code.isdigit()
        if index is not None and xid and int(code) not in APPLICATION_XIDS:
            out.add(index)
    return out


def fake_uuid(index: int) -> str:
    """The uuid the simulated H100s carry (`fakes.gpu`), which the findings name."""
    return f"GPU-fa4e0000-0000-4000-8000-{index:012x}"


def index_of(uuid: str, *, gpus: int) -> int | None:
    return next((i for i in range(gpus) if fake_uuid(i) == uuid), None)
