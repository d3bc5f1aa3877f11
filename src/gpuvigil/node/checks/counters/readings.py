"""The `counters` domain's readings: NVLink (`nvidia-smi nvlink -e`, `dcgmi nvlink`) and NIC
port (`perfquery`, `ethtool -S`) counters from one pasted capture.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class PortCounters:
    name: str  # "lid 3 port 1", "eth0", "mlx5_0 port 1"
    counters: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class NicCounters:
    source: str  # "perfquery" | "ethtool -S"
    ports: tuple[PortCounters, ...] = ()
    problems: tuple[str, ...] = ()
