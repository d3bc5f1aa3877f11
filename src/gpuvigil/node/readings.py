"""Readings: the frozen values probes return and pure rules consume.

One module so that rules (which may not import probes) and the simulator (which builds
readings from simulated hardware) share one definition of each. Sections by source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# --- GPU: NVML and nvidia-smi (owner: layer-1 GPU work) ------------------------------------


# --- DCGM (owner: layer-1 GPU work) --------------------------------------------------------


# --- Kernel log: Xid and SXid events (owner: layer-1 kernel-log work) ----------------------


# --- Network fabric and PCIe (owner: fabric/preflight work) --------------------------------
# The fabric probe (`node/probes/fabric.py`) and the simulator build these; the fabric
# rules (`node/rules/fabric.py`) judge them. A value that could not be read is None and
# the reason is in `problems`: the rules turn problems into findings (fail closed).


@dataclass(frozen=True)
class NetDev:
    """The network interface that belongs to an adapter (EFA/RoCE), from sysfs class/net."""

    name: str
    operstate: str | None  # "up", "down", "lowerlayerdown", ... (None: unreadable)
    carrier: int | None  # 1 link up, 0 down (None: unreadable, or the interface is down)


@dataclass(frozen=True)
class FabricPort:
    """One port of an RDMA adapter (`/sys/class/infiniband/<dev>/ports/<n>/`)."""

    number: int
    state: str | None  # "ACTIVE", "DOWN", "INIT", "ARMED" (text after "4: ")
    phys_state: str | None  # "LinkUp", "Polling", "Disabled", ...
    rate_gbps: float | None  # from "400 Gb/sec (4X NDR)"
    link_layer: str | None  # "InfiniBand" | "Ethernet" | "Unspecified" (EFA)
    # counters/ and hw_counters/ merged; hw_counters keep their own names.
    counters: tuple[tuple[str, int], ...] = ()
    problems: tuple[str, ...] = ()  # files that could not be read or parsed

    def counter(self, name: str) -> int | None:
        return dict(self.counters).get(name)


@dataclass(frozen=True)
class FabricAdapter:
    """One RDMA device: an InfiniBand/RoCE HCA (mlx5_*) or an AWS EFA (rdmap*)."""

    name: str
    kind: str  # "efa" | "ib" | "roce" (from the driver/name and the ports' link layer)
    ports: tuple[FabricPort, ...]
    pci_address: str | None = None
    hca_type: str | None = None  # "MT4129" (ConnectX-7), "efa", ...
    netdevs: tuple[NetDev, ...] = ()
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class FiInfo:
    """What `fi_info -p efa` listed: unique EFA domains (`rdmap79s0`), or why it could not."""

    domains: tuple[str, ...] = ()
    ran: bool = False  # False: not installed and not required
    error: str | None = None  # "missing" | "timeout" | "exit <n>: <stderr>" | "oserror"


@dataclass(frozen=True)
class FabricReading:
    """The node's RDMA adapters at one moment; `taken_at` dates the counters for rates."""

    taken_at: datetime
    adapters: tuple[FabricAdapter, ...]
    sysfs_present: bool = True  # False: /sys/class/infiniband does not exist at all
    problems: tuple[str, ...] = ()
    fi_info: FiInfo | None = None


@dataclass(frozen=True)
class PcieLink:
    """One PCIe function's link (`/sys/bus/pci/devices/<addr>/current_link_*`)."""

    address: str  # "0000:18:00.0"
    role: str  # "gpu" | "nic"
    name: str  # "gpu:0000:18:00.0" or the adapter name ("mlx5_0")
    speed_gts: float | None  # current; None when "Unknown" (link down) or unreadable
    max_speed_gts: float | None
    width: int | None  # current lanes; 0 when the link is down
    max_width: int | None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class PcieReading:
    taken_at: datetime
    links: tuple[PcieLink, ...]
    problems: tuple[str, ...] = ()
