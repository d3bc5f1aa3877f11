"""The `fabric_manager` domain's readings: Fabric Manager's log (nv-fabricmanager journal,
/var/log/fabricmanager.log, systemctl status) and the GPUs' fabric registration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FmEventKind = Literal["started", "stopped", "failed", "error", "sxid_fatal", "sxid_nonfatal"]


@dataclass(frozen=True)
class FmEvent:
    kind: FmEventKind
    line: str
    timestamp: str | None = None  # as printed
    sxid: int | None = None  # NVSwitch error number, for the sxid_* kinds
    switch: str | None = None  # NVSwitch PCI bus id, when the line names it


@dataclass(frozen=True)
class FabricManagerLog:
    """What a Fabric Manager log says, in order. `lines_read` counts the FM lines."""

    events: tuple[FmEvent, ...] = ()
    lines_read: int = 0
    source: str = "fabricmanager"  # "journal" | "log file" | "systemctl status"


@dataclass(frozen=True)
class FabricRegistration:
    """A GPU's `Fabric` section in `nvidia-smi -q` (NVSwitch systems register each GPU
    with the NVLink fabric through Fabric Manager; other GPUs print N/A)."""

    index: int  # the GPU's index; negative when the output does not say which GPU
    bus_id: str | None = None
    state: str | None = None  # "Completed" | "In Progress" | "Not Started" | "N/A"
    status: str | None = None  # "Success" | "N/A" | an NVML error name


@dataclass(frozen=True)
class GpuFabricStates:
    gpus: tuple[FabricRegistration, ...] = ()
