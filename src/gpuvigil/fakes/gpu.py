"""A fake GPU node: the hardware model behind the fake NVML module and the simulator.

One `FakeGpu` per GPU holds everything gpuvigil reads through NVML (identity, ECC, retired
pages, remapped rows, temperatures, clock-event reasons, PCIe link, NVLink links, pending
Xid events) plus the failure switches (`lost`, `hang`, per-function NVML errors).
A `FakeNode` is a list of them plus node-wide state (driver loaded, NVML library present,
adapters for the fabric fakes). Both round-trip through plain dicts so a scenario can be a
JSON or YAML file that a subprocess (the NVML worker, an agent) reads through
`GPUVIGIL_FAKE_NVML_SCENARIO`; tests rewrite the file to inject faults while it runs.

Used by `gpuvigil.fakes.nvml`, `gpuvigil.fakes.faults`, the tests and the simulator.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCENARIO_ENV = "GPUVIGIL_FAKE_NVML_SCENARIO"

# NVML architecture numbers (nvmlDeviceArchitecture_t, nvidia-ml-py's NVML_DEVICE_ARCH_*).
ARCH_VOLTA, ARCH_AMPERE, ARCH_HOPPER, ARCH_BLACKWELL = 5, 7, 9, 10

# Clock-event reason bits (nvmlClocksEventReason*, same values as the older
# nvmlClocksThrottleReason* names).
CLOCK_GPU_IDLE = 0x1
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80


@dataclass
class FakeNvLink:
    """One NVLink link: state and the data-link error counters NVML exposes."""

    active: bool = True
    replay: int = 0  # NVML_NVLINK_ERROR_DL_REPLAY
    recovery: int = 0  # NVML_NVLINK_ERROR_DL_RECOVERY
    crc_flit: int = 0  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    crc_data: int = 0  # NVML_NVLINK_ERROR_DL_CRC_DATA


@dataclass
class FakeXid:
    """An Xid event waiting to be delivered through nvmlEventSetWait (and, for the
    kernel-log fakes, printed as an NVRM line). `boot` marks driver-load noise."""

    code: int
    boot: bool = False


@dataclass
class FakeGpu:
    """Everything gpuvigil reads from one GPU, and the switches that make it misbehave."""

    index: int = 0
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    serial: str = ""
    pci_bus_id: str = ""  # NVML form: "00000000:18:00.0"
    architecture: int = ARCH_HOPPER
    memory_total_mib: int = 81559
    # ECC: mode and counters (volatile = since driver load, aggregate = lifetime).
    ecc_supported: bool = True
    ecc_enabled: bool = True
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    # Page retirement (Volta/Turing); NotSupported on Ampere and later.
    retired_pages_supported: bool = False
    retired_sbe: list[int] = field(default_factory=list)
    retired_dbe: list[int] = field(default_factory=list)
    retired_pending: bool = False
    # Row remapping (Ampere and later).
    remap_supported: bool = True
    remap_corrected: int = 0
    remap_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    # Temperatures (degrees C) and NVML's own thresholds.
    temperature_gpu_c: int = 35
    temperature_memory_c: int = 40
    slowdown_threshold_c: int = 90
    shutdown_threshold_c: int = 92
    memory_max_threshold_c: int = 95
    clock_event_reasons: int = CLOCK_GPU_IDLE
    # PCIe link: current vs the maximum the GPU and the slot support.
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    nvlinks: list[FakeNvLink] = field(default_factory=list)
    xids: list[FakeXid] = field(default_factory=list)
    # The driver's recovery verdict, nvmlDeviceGpuRecoveryAction_t: 0 none, 1 GPU reset,
    # 2 node reboot, 3 drain P2P, 4 drain and reset.
    recovery_action: int = 0
    # Failure switches.
    present: bool = True  # False: off the bus entirely, not even counted by NVML
    lost: bool = False  # every call on this GPU raises NVMLError_GpuIsLost
    hang: bool = False  # every call on this GPU blocks (until the switch is cleared)
    errors: dict[str, int] = field(default_factory=dict)  # nvml function name or "*" -> code
    sdc: bool = False  # silent data corruption: answers NVML fine, computes wrong results

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-fa4e0000-0000-4000-8000-{self.index:012x}"
        if not self.serial:
            self.serial = f"165432100{self.index:04d}"
        if not self.pci_bus_id:
            self.pci_bus_id = f"00000000:{_H100_BUSES[self.index % len(_H100_BUSES)]}:00.0"


# Bus numbers of a typical 8-GPU HGX H100 board (p5.48xlarge-like layout).
_H100_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


@dataclass
class FakeNode:
    """A node: its GPUs and the node-wide switches (driver, NVML library, tools, fabric)."""

    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "550.90.07"
    nvml_version: str = "12.550.90.07"
    driver_loaded: bool = True  # False: nvmlInit raises NVMLError_DriverNotLoaded
    library_present: bool = True  # False: nvmlInit raises NVMLError_LibraryNotFound
    init_hang: bool = False  # nvmlInit itself blocks
    # Tools broken on this node, by name ("nvidia-smi", "dcgmi", ...): "hang" | "missing" |
    # "crash" | "garbage". The fake-binary builders honour these.
    tools: dict[str, str] = field(default_factory=dict)
    # Network adapters for the fabric fakes (gpuvigil.fakes.sysfs builds trees from these).
    adapters_expected: int = 32
    adapters_missing: int = 0
    adapters_down: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FakeNode:
        """Build from a scenario mapping; unknown keys are errors (a typo is not a fault)."""
        data = dict(data)
        gpus = [_gpu_from_dict(g) for g in data.pop("gpus", [])]
        _reject_unknown(cls, data, "node")
        return cls(gpus=gpus, **data)

    def save(self, path: Path) -> None:
        """Write atomically, so a reader in another process never sees half a file."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> FakeNode:
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        return cls.from_dict(data)

    def gpu(self, index: int) -> FakeGpu:
        return next(g for g in self.gpus if g.index == index)


def _gpu_from_dict(data: dict[str, Any]) -> FakeGpu:
    data = dict(data)
    links = [FakeNvLink(**link) for link in data.pop("nvlinks", [])]
    xids = [FakeXid(**x) if isinstance(x, dict) else FakeXid(int(x)) for x in data.pop("xids", [])]
    _reject_unknown(FakeGpu, data, "gpu")
    return FakeGpu(nvlinks=links, xids=xids, **data)


def _reject_unknown(cls: type, data: dict[str, Any], what: str) -> None:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {what} key(s) in fake scenario: {', '.join(unknown)}")


# --- Builders for common machines ----------------------------------------------------------

_MODELS: dict[str, dict[str, Any]] = {
    "H100": dict(
        name="NVIDIA H100 80GB HBM3", architecture=ARCH_HOPPER, memory_total_mib=81559, links=18
    ),
    "A100": dict(
        name="NVIDIA A100-SXM4-80GB", architecture=ARCH_AMPERE, memory_total_mib=81920, links=12
    ),
    "B200": dict(
        name="NVIDIA B200", architecture=ARCH_BLACKWELL, memory_total_mib=183359, links=18
    ),
    "V100": dict(
        name="Tesla V100-SXM2-32GB",
        architecture=ARCH_VOLTA,
        memory_total_mib=32768,
        links=6,
        retired_pages_supported=True,
        remap_supported=False,
        pcie_gen=3,
        pcie_gen_max=3,
    ),
}


def make_gpu(index: int, *, model: str = "H100") -> FakeGpu:
    spec = dict(_MODELS[model])
    links = spec.pop("links")
    return FakeGpu(index=index, nvlinks=[FakeNvLink() for _ in range(links)], **spec)


def make_node(gpus: int = 8, *, model: str = "H100") -> FakeNode:
    """A healthy node: `gpus` GPUs of `model` ("H100", "A100", "B200", "V100")."""
    return FakeNode(gpus=[make_gpu(i, model=model) for i in range(gpus)])
