"""What nvidia-smi says when it cannot report, read from its stdout and stderr alike.

nvidia-smi prints these on standard output (and exits non-zero), so a reader that looks
only at stderr, or only for the XML document, mistakes them for garbage:

- `Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the
  system to recover this GPU` (also `Unknown Error`, `GPU requires reset`): that GPU is
  lost; the others may still be described after it.
- `NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure
  that the latest NVIDIA driver is installed and running.` and `Failed to initialize NVML:
  Driver/library version mismatch`: the driver is not usable (DRIVER_UNAVAILABLE).
- `No devices were found`: the driver runs and sees no GPU; judged against the count the
  node should have (GPU_COUNT_LOW), never as "healthy, no GPUs".

Pure; used by `nvidia_smi.parse_xml` for every nvidia-smi form (XML, `-q`, CSV).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvigil.node.checks.gpu.readings import GpuReading, ReadError

LOST_LINE = re.compile(
    r"Unable to determine the device handle for (?:GPU\s*)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:"
    r"[0-9A-Fa-f]{2}\.[0-7]):\s*(.*)",
    re.I,
)
# (text, NVML-style error name, why) - the name is what the GPU rules key on.
_DRIVER = (
    ("couldn't communicate with the nvidia driver", "DriverNotLoaded"),
    ("driver/library version mismatch", "LibRmVersionMismatch"),
    ("failed to initialize nvml", "Uninitialized"),
    ("couldn't find libnvidia-ml.so", "LibraryNotFound"),
)
_NO_DEVICES = re.compile(r"^\s*No devices were found\s*$", re.I | re.M)
# More GPUs than any one node has: not one node's output (or hostile); keep the first.
MAX_GPUS = 256


def capped(gpus: list[GpuReading], errors: list[ReadError]) -> list[GpuReading]:
    """The first MAX_GPUS readings; past that, a ReadError says the rest were dropped."""
    if len(gpus) > MAX_GPUS:
        errors.append(
            ReadError("gpu", "Incomplete", f"{len(gpus)} GPUs listed: more than one node has")
        )
    return gpus[:MAX_GPUS]


@dataclass(frozen=True)
class SmiErrors:
    lost: tuple[GpuReading, ...] = ()  # one reading per GPU nvidia-smi could not reach
    driver: ReadError | None = None  # the driver is not usable at all
    no_devices: bool = False


def scan(text: str) -> SmiErrors:
    lost = tuple(
        GpuReading(
            index=-1,
            pci_bus_id=normal_bus(m.group(1)),
            lost=True,
            errors=(ReadError("handle", "Unknown", m.group(2).strip()[:200]),),
        )
        for m in LOST_LINE.finditer(text)
    )
    low = text[:20000].lower()  # these are one-line answers printed first
    driver = None
    for needle, name in _DRIVER:
        at = low.find(needle)
        if at >= 0:
            line_start = low.rfind("\n", 0, at) + 1
            line_end = low.find("\n", at)
            line = text[line_start : line_end if line_end >= 0 else None].strip()
            driver = ReadError("driver", name, line[:300])
            break
    return SmiErrors(lost=lost, driver=driver, no_devices=bool(_NO_DEVICES.search(text[:20000])))


def normal_bus(bus: str) -> str:
    """NVML form: 8-digit domain, upper case ("0000:3b:00.0" -> "00000000:3B:00.0")."""
    domain, rest = bus.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"
