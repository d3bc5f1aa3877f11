"""The `kernel_log` domain's readings: Xid and SXid events, GPU failures the driver logs
without an Xid, one read of the kernel log, and a person's release (events before it no
longer count).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

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
    # The GPU index NVML named the event by: a GPU fallen off the bus (Xid 79) may name no
    # bus, and the rules still place the finding on gpu:<index>, not on an empty `pci:`.
    gpu_index: int | None = None

    @property
    def code_name(self) -> str:
        """The finding code: XID_<n> or SXID_<n>."""
        return f"{'S' if self.kind == 'sxid' else ''}XID_{self.code}"

    def with_(self, **changes: Any) -> XidEvent:
        """A copy with some fields set (readers add source, seq, boot id, derived time)."""
        return replace(self, **changes)


DriverFaultKind = Literal["fallen_off_bus", "init_failed", "nvlink_training", "gsp_timeout"]


@dataclass(frozen=True, slots=True)
class DriverFault:
    """A GPU failure the NVIDIA driver logged without an Xid: the GPU fell off the bus
    (at probe time, or said over several `NVRM:` lines), the driver could not initialise
    it (`RmInitAdapter failed`, a failed probe), or an NVLink did not train.

    `bus_id` is normalized (see `normalize_bus_id`), None when the line names no GPU.
    Producer: `node.checks.kernel_log.kernel_faults`; consumer:
    `node.checks.kernel_log.rules.driver_faults`.
    """

    kind: DriverFaultKind
    bus_id: str | None
    line: str
    timestamp: str | None = None
    time: datetime | None = None
    uptime_s: float | None = None


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
    faults: tuple[DriverFault, ...] = ()  # since the last boot the log shows


@dataclass(frozen=True, slots=True)
class Release:
    """A person released the node at `at` (`gpuvigil release`, or `<state_dir>/released-at`):
    events logged before it no longer count."""

    at: datetime
