"""The `gpu` domain's readings: what NVML and nvidia-smi say about each GPU, the node's GPU
inventory and the facts about GPUs other parts learn (expected count, source in use,
NVML's Xid events, resets done, GPUs known from earlier sweeps). Every field is None when
the source could not say: rules treat None as "unknown", never as healthy-by-default.
Other domains read `GpuInventory`, `GpuRef` and `KnownGpus` from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from gpuvigil.node.bus_ids import normalize_bus_id
from gpuvigil.node.checks.kernel_log.readings import XidEvent

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


# NVML errors that mean "this GPU is gone or wedged" (the worker stops asking such a GPU,
# the readings mark it lost, the rules call it GPU_LOST).
LOST_ERRORS = frozenset({"GpuIsLost", "Unknown", "ResetRequired"})


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
    # The driver's own verdict (nvmlDeviceGpuRecoveryAction_t, r550+; older drivers: reset
    # status): "NONE", "GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET",
    # "RECOVER_IMEX_DOMAIN", "BUS_RESET", "SYSTEM_REBOOT".
    recovery_action: str | None = None
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

    def gpu_map(self, known: Mapping[str, GpuRef] | None = None) -> dict[str, GpuRef]:
        """Normalized bus id -> GpuRef, the Xid rules' view of these GPUs (lower-case
        family, as the Xid catalog names them).

        A GPU that stopped answering has no bus id in this snapshot; `known` (the map of the
        previous sweep) keeps the one it had, so the Xid 79 the kernel logs for it stays on
        `gpu:<index>` and the GPU is not counted again as `pci:<bus id>`."""
        refs = {}
        for g in self.gpus:
            bus = normalize_bus_id(g.pci_bus_id) if g.pci_bus_id else None
            if bus is not None and g.index >= 0:
                family = g.architecture.lower() if g.architecture else None
                refs[bus] = GpuRef(index=g.index, bus_id=bus, family=family, uuid=g.uuid)
        silent = {g.index for g in self.gpus if g.pci_bus_id is None}
        taken = {r.index for r in refs.values()}
        for bus, ref in (known or {}).items():
            if ref.index in silent and ref.index not in taken and bus not in refs:
                refs[bus] = ref
        return refs


@dataclass(frozen=True, slots=True)
class ExpectedGpus:
    """How many GPUs this node must have, and who says so (the count rule's reference)."""

    count: int | None  # None: nothing expected (only what the source attaches is judged)
    source: str = "none"  # "config" | "catalog:<type>" | "pci-bus" | "none"


@dataclass(frozen=True, slots=True)
class GpuSource:
    """Whether the primary GPU source (NVML) answered, and what stood in for it.

    `primary_error` is NVML's start-up failure (init, binding import); then `used` names
    the fallback whose GpuInventory is the node's reading ("nvidia-smi"), or "none" with
    `fallback_error` saying why that failed too. `said`: the catalog's error phrases in the
    fallback's own output (`catalog.phrases.Hit`), which the check judges as `analyze`
    judges the same text (`capture.error_text`: never healthy on an error).
    """

    primary_error: ReadError | None = None
    used: Literal["nvml", "nvidia-smi", "none"] = "nvml"
    fallback_error: str | None = None
    module: str = "pynvml"
    said: tuple[Any, ...] = ()

    # What `analyze` calls this text: the kind its phrases' `explained_by` lists.
    SAID_KIND = "nvidia-smi-xml"


@dataclass(frozen=True, slots=True)
class NvmlXidEvents:
    """The Xid events NVML's event set delivered since the agent started (source "nvml"),
    bounded, oldest first: the kernel-log rule's second source."""

    events: tuple[XidEvent, ...] = ()


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


# Facts no probe reads from the hardware: the agent's own remediation (and, in
# kernel_log's readings, a person's release). The kernel-log rule reads both, on the polled
# and on the streamed path.
@dataclass(frozen=True, slots=True)
class GpuReset:
    """One successful GPU reset by this node's remediator.

    `at` is when the reset *started*: an event logged after that is not known to be cured
    by it. `gpus` are the GPU indices reset; empty means every GPU (a reset naming none).
    `bus_ids` are their normalized PCI bus ids when the remediator knew them.
    """

    at: datetime
    gpus: tuple[int, ...] = ()
    bus_ids: tuple[str, ...] = ()
    boot_id: str | None = None  # the boot it happened in; a reboot supersedes it anyway

    def covers(self, ref: GpuRef | None, bus_id: str | None) -> bool:
        if not self.gpus and not self.bus_ids:
            return True
        if bus_id is not None and bus_id in self.bus_ids:
            return True
        return ref is not None and ref.index in self.gpus


@dataclass(frozen=True, slots=True)
class GpuResets:
    """Every successful GPU reset this boot, oldest first (bounded by the remediator)."""

    resets: tuple[GpuReset, ...] = ()

    def latest(self, bus_id: str | None, gpus: GpuMap) -> datetime | None:
        """The latest reset that covers the GPU at `bus_id` (normalized), or None."""
        ref = gpus.get(bus_id or "")
        times = [r.at for r in self.resets if r.covers(ref, bus_id)]
        return max(times) if times else None

    def with_(self, reset: GpuReset, *, keep: int = 64) -> GpuResets:
        return GpuResets((*self.resets, reset)[-keep:])


@dataclass(frozen=True, slots=True)
class KnownGpus:
    """GPUs known by PCI bus id beyond what this moment's inventory says: the `gpu` check's
    map carried from sweep to sweep (a GPU that stopped answering keeps the bus id an
    earlier sweep read, `GpuInventory.gpu_map(known=)`), or the GPU readings of a support
    bundle (`gpuvigil analyze`), which name the GPUs of the kernel log captured beside
    them. The `xid` and `driver_faults` rules read it with the inventory."""

    by_bus: Mapping[str, GpuRef] = field(default_factory=dict)


def gpus_by_bus(inv: GpuInventory | None, known: KnownGpus | None) -> dict[str, GpuRef]:
    """Normalized bus id -> GPU: this moment's inventory, the known GPUs it is silent about."""
    before = known.by_bus if known is not None else None
    if inv is None:
        return dict(before or {})
    return inv.gpu_map(known=before)


@dataclass(frozen=True)
class PartialGpuInventory:
    """A filtered or excerpted `nvidia-smi -q` (`-d ECC`, `-i 3`, one section of it): the
    GPU readings its lines hold, the sections it held and the checks the missing sections
    leave unmade."""

    inventory: GpuInventory
    sections: tuple[str, ...] = ()
    not_checked: tuple[str, ...] = ()
    command: str | None = None  # the nvidia-smi command line the paste shows, if any
    unnamed: tuple[tuple[int, str], ...] = ()  # (stand-in index, "bus id" or "?")
