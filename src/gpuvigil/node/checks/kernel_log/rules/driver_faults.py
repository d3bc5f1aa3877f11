"""GPU failures the driver logged without an Xid (DriverFault readings) -> findings. Pure.

A GPU that fell off the bus is GPU_LOST, one the driver could not initialise is
GPU_INIT_FAILED (both fatal: only a reboot cures them, so the reader keeps only what the
log shows since its last boot), an NVLink that did not train is NVLINK_DOWN, the GSP
timeout banner without its Xid line is XID_119 (the Xid catalog's reset verdict). One finding
per (code, component); the component is the GPU when the bus id maps to one, else
`pci:<bus>`, else `node`. Registered as the `driver_faults` rule over a KernelLog:
`node.pipeline` feeds it for the kernel_log check, the agent's stream and `analyze`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuvigil.core import codes
from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuRef, KnownGpus, gpus_by_bus
from gpuvigil.node.checks.kernel_log.readings import DriverFault, KernelLog
from gpuvigil.node.pipeline.registry import Inputs, rule

# kind -> (code, action, fatal, what it means)
_VERDICT = {
    "fallen_off_bus": ("GPU_LOST", Action.REBOOT, True, "the GPU fell off the bus"),
    "init_failed": (
        "GPU_INIT_FAILED",
        Action.REBOOT,
        True,
        "the driver could not initialise the GPU",
    ),
    "nvlink_training": ("NVLINK_DOWN", Action.RESET_GPU, False, "an NVLink did not train"),
    # Xid 119's event told by its banner alone: the catalog's verdict for 119 (reset).
    "gsp_timeout": (
        "XID_119",
        Action.RESET_GPU,
        True,
        "the GPU's GSP firmware stopped answering the driver (Xid 119's event)",
    ),
}


def evaluate(
    log: KernelLog,
    *,
    now: datetime,
    gpus: Mapping[str, GpuRef] | None = None,
    check: str = "kernel_log",
) -> list[Finding]:
    # The driver follows an Xid 79 with its own "GPU has fallen off the bus" line: that
    # GPU is the Xid rules' finding already.
    xid79 = {ev.bus_id for ev in log.events if ev.kind == "xid" and ev.code == 79}
    # Likewise an Xid 119 line is the Xid rules' finding; the GSP banner names no bus.
    xid119 = any(ev.kind == "xid" and ev.code == 119 for ev in log.events)
    groups: dict[tuple[str, str], list[DriverFault]] = {}
    for fault in log.faults:
        if fault.kind == "fallen_off_bus" and fault.bus_id in xid79:
            continue
        if fault.kind == "gsp_timeout" and xid119:
            continue
        groups.setdefault((fault.kind, _component(fault, gpus or {})), []).append(fault)
    out = []
    for (kind, component), seen in groups.items():
        code, action, fatal, what = _VERDICT[kind]
        last = seen[-1]
        out.append(
            Finding(
                check=check,
                status=Status.FAILED,
                code=code,
                component=component,
                message=f"{what} (kernel log, no Xid): {last.line.strip()[:200]}",
                action=action,
                fatal=fatal,
                evidence={
                    "bus_id": last.bus_id,
                    "line": last.line,
                    "timestamp": last.timestamp,
                    "count": len(seen),
                    "source": "kernel log",
                },
                observed_at=last.time or now,
            )
        )
    out.sort(key=lambda f: (f.code, f.component))
    return out


@rule(
    "driver_faults",
    reads=KernelLog,
    uses=(GpuInventory, KnownGpus),
    # the GSP timeout banner is Xid 119's event: declared through the Xid placeholder, as
    # the kernel_log domain declares its Xid codes
    codes=("GPU_INIT_FAILED", "GPU_LOST", "NVLINK_DOWN", codes.ANY_XID),
)
def driver_faults_rule(log: KernelLog, on: Inputs) -> list[Finding]:
    """GPU failures the driver logged without an Xid: fallen off the bus, not initialised,
    an NVLink that did not train, the GSP timeout banner."""
    gpus = gpus_by_bus(on.get(GpuInventory), on.get(KnownGpus))
    return evaluate(log, now=on.now, gpus=gpus, check=on.check)


def _component(fault: DriverFault, gpus: Mapping[str, GpuRef]) -> str:
    if fault.bus_id is None:
        return "node"
    ref = gpus.get(fault.bus_id)
    return f"gpu:{ref.index}" if ref else f"pci:{fault.bus_id}"
