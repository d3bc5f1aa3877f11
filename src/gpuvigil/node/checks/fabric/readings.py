"""The `fabric` domain's readings: the node's instance type and its network adapters and
ports. A value that could not be read is None and the reason is in `problems`: the rules
turn problems into findings (fail closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuvigil.node.catalog.instances import InstanceType


@dataclass(frozen=True, slots=True)
class NodeInstance:
    """This node's instance type: as configured or read from DMI, and its catalog entry."""

    name: str | None = None
    entry: tuple[str, InstanceType] | None = None
    configured: bool = False  # named in the config (an unknown name is then an error)


@dataclass(frozen=True)
class NetDev:
    """The network interface that belongs to an adapter (EFA/RoCE), from sysfs class/net."""

    name: str
    operstate: str | None  # "up", "down", "lowerlayerdown", ... (None: unreadable)
    carrier: int | None  # 1 link up, 0 down (None: unreadable, or the interface is down)


@dataclass(frozen=True)
class FabricExpectation:
    """What this node's fabric should have; any field None is not judged. The `fabric`
    rule derives it from the config and the instance type, unless one is given as a fact
    (`gpuvigil analyze --expect-ib N / --expect-efa N`)."""

    kind: str | None = None
    count: int | None = None
    rate_gbps: float | None = None
    instance_type: str | None = None
    source: str = "none"  # "config" | "catalog:<type>" | "none" | the flag that set it


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
    # Where the adapters were read: "sysfs", or a tool's output ("ibstat", "ibstatus",
    # "ibv_devinfo", "ibdev2netdev", "fi_info": that one lists EFA devices only).
    source: str = "sysfs"
