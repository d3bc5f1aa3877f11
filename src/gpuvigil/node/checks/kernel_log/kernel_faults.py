"""GPU failures the NVIDIA driver logs without an Xid -> DriverFault readings. Pure.

Lines read (one example each in docs/kernel-log.md):

- fallen off the bus: `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`, `NVRM: GPU at
  0000:01:00.0 has fallen off the bus.`, and the three-line form printed when it happens
  at probe time (`NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID: 10de:26b5) installed
  in this system has` / `NVRM: fallen off the bus and is not responding to commands.`);
- the driver could not initialise a GPU: `NVRM: GPU 0000:01:00.0: RmInitAdapter failed!
  (0x22:0x56:894)`, `rm_init_adapter failed, device minor number 0`, `NVRM: The NVIDIA
  probe routine failed for 1 device(s).`, `nvidia 0000:01:00.0: probe with driver nvidia
  failed with error -1`, and Xorg's `(EE) NVIDIA(GPU-0): Failed to initialize the NVIDIA GPU
  at PCI:1:0:0.` (relayed to the journal; Xorg's bus form is not a PCI id, so no GPU named);
- the GPU's GSP firmware stopped answering: `NVRM: GPU6 _kgspLogRpcTimeout: *** GSP Timeout
  ***`, `_kgspIsHeartbeatTimedOut: Heartbeat timed out`, `Timeout waiting for RPC from GSP!`
  (what Xid 119 reports; the banner can come without the Xid line, in an excerpt or when the
  driver logs it first);
- an NVLink that did not train, when the driver says so outside an Xid line.

A line that is an Xid event is left to the Xid parser (one event, one finding). A new boot
in the log (`Linux version ...`) clears what came before it: only a reboot cures these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, tzinfo

from gpuvigil.node.bus_ids import normalize_bus_id
from gpuvigil.node.checks.kernel_log.kernel_log_parser import stamp_before
from gpuvigil.node.checks.kernel_log.readings import DriverFault, DriverFaultKind

# Byte needles for the line scanner (`log_lines`): one of them is on every line read here.
NEEDLES = (
    b"fallen off the bus",
    b"NVRM: The NVIDIA GPU ",
    b"RmInitAdapter failed",
    b"rm_init_adapter failed",
    b"probe routine failed",
    b"with driver nvidia failed",
    b"raining failed",
    b"failed to train link",
    b"Failed to initialize the NVIDIA GPU",
    b"_kgspLogRpcTimeout",
    b"Heartbeat timed out",
    b"RPC from GSP",
    b"Linux version ",
)
_BUS = re.compile(
    r"(?<![0-9A-Fa-f:])(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\b"
)
_MESSAGE = re.compile(r"NVRM:|nvidia(?:-nvlink)?[ :]|NVLink|Linux version")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU ((?:PCI:)?[0-9A-Fa-f:.]+)")
_BOOT = re.compile(r"\bLinux version \d")


@dataclass
class FaultScanner:
    """Feed it the kernel-log lines that hold a needle, in order; read `faults` at the end."""

    tz: tzinfo = UTC
    year: int | None = None
    faults: list[DriverFault] = field(default_factory=list)
    _pending_bus: str | None = None  # from "NVRM: The NVIDIA GPU <bus>", for what follows

    def feed(self, line: str) -> None:
        if "Xid (" in line:
            return
        if _BOOT.search(line):
            self.faults.clear()  # a new boot: what the driver said before it is over
            self._pending_bus = None
            return
        the_gpu = _THE_GPU.search(line)
        if the_gpu and "fallen off" not in line:
            self._pending_bus = normalize_bus_id(the_gpu.group(1))
            return
        kind = _kind(line)
        if kind is None:
            return
        bm = _BUS.search(line)
        # The multi-line forms name the GPU only on their first line.
        bus = normalize_bus_id(bm.group(1)) if bm else self._pending_bus
        mm = _MESSAGE.search(line)
        stamp = stamp_before(line, mm.start() if mm else 0, tz=self.tz, year=self.year)
        self.faults.append(
            DriverFault(
                kind=kind,
                bus_id=bus,
                line=line[:1000],
                timestamp=stamp.text,
                time=stamp.time,
                uptime_s=stamp.uptime_s,
            )
        )


def _kind(line: str) -> DriverFaultKind | None:
    if "fallen off the bus" in line:
        return "fallen_off_bus"
    low = line.lower()
    if "rminitadapter failed" in low or "rm_init_adapter failed" in low:
        return "init_failed"
    if "probe routine failed" in low or "with driver nvidia failed" in low:
        return "init_failed"
    if "failed to initialize the nvidia gpu" in low:
        return "init_failed"
    if (
        "_kgsplogrpctimeout" in low
        or ("heartbeat timed out" in low and "kgsp" in low)
        or "timeout waiting for rpc from gsp" in low
    ):
        return "gsp_timeout"
    if ("raining failed" in low or "failed to train link" in low) and "nvlink" in low:
        return "nvlink_training"
    return None


def scan_faults(
    lines: list[str], *, tz: tzinfo = UTC, year: int | None = None
) -> list[DriverFault]:
    scanner = FaultScanner(tz=tz, year=year)
    for line in lines:
        scanner.feed(line)
    return scanner.faults
