"""Readings of the tools an operator pastes that no live probe runs: Fabric Manager logs,
`nvidia-smi nvlink -e` / `dcgmi nvlink`, `nvidia-smi topo -m`, and NIC counters
(`perfquery`, `ethtool -S`). Frozen values; the readers are in `node.probes`, the rules
in `node.rules`. Kept beside `node.readings` (which holds the live checks' readings) so
the two can move together into per-domain folders later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuvigil.node.readings import GpuInventory

# --- Fabric Manager (nv-fabricmanager journal, /var/log/fabricmanager.log, systemctl status)

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


# --- NVLink per link (nvidia-smi nvlink -e, dcgmi nvlink -e / -s) ------------------------


@dataclass(frozen=True)
class LinkCounters:
    link: int
    state: str | None = None  # "up" | "down" | "disabled" | None (not stated)
    counters: tuple[tuple[str, int], ...] = ()  # normalised names: replay, recovery, crc...


@dataclass(frozen=True)
class LinkOwner:
    """A GPU (`gpu:<index>`) or an NVSwitch (`nvswitch:<physical id>`) and its links."""

    component: str
    links: tuple[LinkCounters, ...] = ()
    uuid: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class NvLinkReport:
    source: str  # "nvidia-smi nvlink -e" | "dcgmi nvlink -e" | "dcgmi nvlink -s"
    owners: tuple[LinkOwner, ...] = ()
    problems: tuple[str, ...] = ()  # lines that said an error or could not be read


# --- Topology (nvidia-smi topo -m) -------------------------------------------------------


@dataclass(frozen=True)
class GpuTopology:
    """The GPUs and NICs `topo -m` lists, and the link between each pair of GPUs."""

    gpus: tuple[int, ...] = ()
    nics: tuple[str, ...] = ()  # legend names (mlx5_0) when given, else NIC0...
    pairs: tuple[tuple[int, int, str], ...] = ()  # (gpu a, gpu b, "NV18" | "SYS" | ...)
    problems: tuple[str, ...] = ()


# --- NIC error counters (perfquery, ethtool -S) -------------------------------------------


@dataclass(frozen=True)
class PortCounters:
    name: str  # "lid 3 port 1", "eth0", "mlx5_0 port 1"
    counters: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class NicCounters:
    source: str  # "perfquery" | "ethtool -S"
    ports: tuple[PortCounters, ...] = ()
    problems: tuple[str, ...] = ()


# --- Partial nvidia-smi -q (-d ECC, -i N, excerpts) and the GPUs' fabric registration ---


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


@dataclass(frozen=True)
class PartialGpuInventory:
    """A filtered or excerpted `nvidia-smi -q` (`-d ECC`, `-i 3`, one section of it): the
    GPU readings its lines hold, the sections it held and the checks the missing sections
    leave unmade."""

    inventory: GpuInventory
    sections: tuple[str, ...] = ()
    not_checked: tuple[str, ...] = ()
    command: str | None = None  # the nvidia-smi command line the paste shows, if any
    unnamed: tuple[tuple[int, str], ...] = ()  # (stand-in index, "bus id" or "?")
