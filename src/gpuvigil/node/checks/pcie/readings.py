"""The `pcie` domain's readings: PCIe links from sysfs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


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
