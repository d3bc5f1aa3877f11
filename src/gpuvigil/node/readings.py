"""Readings: the frozen values probes return and pure rules consume.

One module so that rules (which may not import probes) and the simulator (which builds
readings from simulated hardware) share one definition of each. Sections by source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# --- GPU: NVML and nvidia-smi (owner: layer-1 GPU work) ------------------------------------
# Every field is None when the source could not say (not supported, N/A, not reported):
# rules treat None as "unknown", never as healthy-by-default for required readings.

# Clock-event reason bits as NVML defines them (nvmlClocksEventReason*); nvidia-smi's named
# fields are converted to the same bits.
CLOCK_GPU_IDLE = 0x1
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class NvLinkReading:
    """One NVLink link: state and its cumulative data-link error counters."""

    link: int
    active: bool | None
    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None


@dataclass(frozen=True, slots=True)
class ReadError:
    """A reading that failed for a reason other than "not supported"."""

    field: str  # what was being read, e.g. "remapped_rows" or "handle"
    error: str  # NVML error name ("GpuIsLost", "Unknown", "Timeout", ...) or a parser note
    message: str = ""


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as NVML or nvidia-smi sees it."""

    index: int
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None  # NVML form, upper case: "00000000:3B:00.0"
    architecture: str | None = None  # "Volta", "Ampere", "Hopper", "Blackwell", ...
    memory_total_mib: int | None = None
    ecc_enabled: bool | None = None
    ecc_pending_enabled: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remap_corrected: int | None = None
    remap_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    temperature_gpu_c: float | None = None
    temperature_memory_c: float | None = None
    slowdown_temp_c: float | None = None  # the GPU's own thresholds, when it reports them
    shutdown_temp_c: float | None = None
    memory_max_temp_c: float | None = None
    clock_event_reasons: int | None = None  # bitmask of CLOCK_* above
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks: tuple[NvLinkReading, ...] = ()
    lost: bool = False  # NVML said "GPU is lost" (or the tool could not reach it)
    errors: tuple[ReadError, ...] = ()

    @property
    def component(self) -> str:
        return f"gpu:{self.index}"


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """All GPUs of a node from one source at one moment."""

    source: str  # "nvml" | "nvidia-smi"
    observed_at: datetime
    gpus: tuple[GpuReading, ...] = ()
    count: int | None = None  # what the source says is attached (may exceed len(gpus))
    driver_version: str | None = None
    errors: tuple[ReadError, ...] = ()  # node-wide problems (truncated output, init failure)

    def by_bus_id(self) -> dict[str, GpuReading]:
        """PCI bus id (upper case, domain kept) -> GPU: for mapping kernel-log Xids."""
        return {g.pci_bus_id.upper(): g for g in self.gpus if g.pci_bus_id}


# --- DCGM (owner: layer-1 GPU work) --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DcgmResult:
    """One line of a DCGM verdict: a health watch system or a diag test, for one GPU
    (gpu None: the whole node / all GPUs)."""

    test: str  # "memory", "nvlink", "pcie" (health); "Memory", "Diagnostic" (diag)
    result: str  # "Pass" | "Fail" | "Warn" | "Skip" | "Incomplete"
    gpu: int | None = None
    info: str = ""


@dataclass(frozen=True, slots=True)
class DcgmReport:
    """What `dcgmi health -c` or `dcgmi diag -r N` said."""

    kind: str  # "health" | "diag"
    results: tuple[DcgmResult, ...] = ()
    overall: str | None = None  # "Pass" | "Fail" | "Warn" | None when not stated
    complete: bool = True  # False: the run stopped early or the output was cut
    errors: tuple[str, ...] = ()  # why the parse is incomplete
    level: int | None = None  # diag run level


# --- Kernel log: Xid and SXid events (owner: layer-1 kernel-log work) ----------------------


# --- Network fabric and PCIe (owner: fabric/preflight work) --------------------------------
