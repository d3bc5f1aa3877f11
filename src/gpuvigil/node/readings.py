"""Readings: the frozen values probes return and pure rules consume.

One module so that rules (which may not import probes) and the simulator (which builds
readings from simulated hardware) share one definition of each. Sections by source.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

# --- GPU: NVML and nvidia-smi (owner: layer-1 GPU work) ------------------------------------


# --- DCGM (owner: layer-1 GPU work) --------------------------------------------------------


# --- Kernel log: Xid and SXid events (owner: layer-1 kernel-log work) ----------------------
# Producers: `node.probes.kernel_log_parser` (one line or /dev/kmsg record -> XidEvent), the
# kernel_log check (-> KernelLog), the agent's /dev/kmsg follower and NVML's event loop
# (source "nvml"). Consumer: `node.rules.xid`.

XidKind = Literal["xid", "sxid"]
XidSource = Literal["kmsg", "dmesg", "journal", "file", "nvml"]


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One Xid (GPU) or SXid (NVSwitch) event line, as the driver printed it.

    `pci_bus_id` is the text inside the parentheses minus a leading "PCI:", exactly as
    printed ("0000:3b:00", "0000:06:00.0"); `bus_id` is its normalized form for matching
    against NVML ("0000:3b:00.0", see `normalize_bus_id`), None when it does not parse.
    `timestamp` is the line's time stamp as printed (no brackets), None when it has none;
    `time` (wall clock, timezone-aware) and `uptime_s` (seconds since boot) are what
    could be derived from it. `message` is the driver's text after the code and the
    pid/name fields; `line` is the whole line.
    """

    kind: XidKind
    code: int
    pci_bus_id: str
    bus_id: str | None
    message: str
    line: str
    timestamp: str | None = None
    time: datetime | None = None
    uptime_s: float | None = None
    source: XidSource = "file"
    seq: int | None = None  # /dev/kmsg sequence number
    pid: int | None = None  # None when printed as '<unknown>' or absent
    process: str | None = None  # the `name=` field; None when '<unknown>' or absent
    device: str | None = None  # the driver instance that printed an SXid ("nvidia-nvswitch1")
    boot_id: str | None = None  # the boot it was logged in, when the reader knows it

    @property
    def code_name(self) -> str:
        """The finding code: XID_<n> or SXID_<n>."""
        return f"{'S' if self.kind == 'sxid' else ''}XID_{self.code}"

    def with_(self, **changes: Any) -> XidEvent:
        """A copy with some fields set (readers add source, seq, boot id, derived time)."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class KernelLog:
    """What one read of the kernel log found, and how trustworthy the read was.

    `driver_loaded_at` is the latest NVIDIA driver load seen in the log ("NVRM: loading
    NVIDIA UNIX ... Kernel Module"); a GPU event before it has been through a reset.
    `gaps` counts records lost to ring-buffer overruns (/dev/kmsg EPIPE) during the read.
    `source` is the source actually used; `fallback_from` names the sources that failed
    before it, each with why.
    """

    events: tuple[XidEvent, ...] = ()
    source: XidSource = "file"
    boot_id: str | None = None
    booted_at: datetime | None = None
    driver_loaded_at: datetime | None = None
    gaps: int = 0
    lines_read: int = 0
    fallback_from: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GpuRef:
    """What the Xid rules need to know about one GPU: which one it is and its family.

    Built from the GPU readings (NVML or nvidia-smi) when available; `family` is one of
    the catalog's families ("volta", "ampere", "hopper", "blackwell") or None.
    """

    index: int
    bus_id: str  # normalized, see normalize_bus_id
    family: str | None = None
    uuid: str | None = None


# Normalized PCI bus id -> GPU. A plain Mapping so any reading can build one.
GpuMap = Mapping[str, GpuRef]


def gpu_map(gpus: Iterable[GpuRef]) -> dict[str, GpuRef]:
    return {g.bus_id: g for g in gpus}


_BUS_ID = re.compile(
    r"^\s*(?:PCI:)?(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?\s*$"
)


def normalize_bus_id(text: str) -> str | None:
    """`PCI:0000:3b:00`, `00000000:3B:00.0`, `3b:00` -> `0000:3b:00.0`; None if not a bus id.

    The kernel log prints a 4-digit domain without the function; NVML prints an 8-digit
    upper-case domain with it. GPUs are function 0, so a missing function means 0.
    """
    m = _BUS_ID.match(text)
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn or '0'}"


# --- Network fabric and PCIe (owner: fabric/preflight work) --------------------------------
