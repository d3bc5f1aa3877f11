"""Readings: the frozen values probes return and pure rules consume.

One module so that rules (which may not import probes) and the simulator (which builds
readings from simulated hardware) share one definition of each. Sections by source.
Every reading travels through `node.pipeline` as a typed fact: a rule declares the types
it reads (`@rule(..., reads=KernelLog, uses=(GpuInventory, GpuResets))`) and the pipeline
hands it the latest of each, never an untyped dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from gpuvigil.node.bus_ids import normalize_bus_id  # lived here: importers still find it

if TYPE_CHECKING:
    from gpuvigil.node.catalog.instances import InstanceType

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
# Producers: `node.checks.kernel_log.kernel_log_parser` (one line or /dev/kmsg record ->
# XidEvent), the
# kernel_log check (-> KernelLog), the agent's /dev/kmsg follower and NVML's event loop
# (source "nvml"). Consumer: `node.checks.kernel_log.rules.xid`.

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


DriverFaultKind = Literal["fallen_off_bus", "init_failed", "nvlink_training"]


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


# --- What the node did and what people said (owner: node pipeline) -------------------------
# Facts no probe reads from the hardware: the agent's own remediation and a person's
# release. The kernel-log rule reads both, on the polled and on the streamed path.


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
class Release:
    """A person released the node at `at` (`gpuvigil release`, or `<state_dir>/released-at`):
    events logged before it no longer count."""

    at: datetime


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


@dataclass(frozen=True, slots=True)
class NodeInstance:
    """This node's instance type: as configured or read from DMI, and its catalog entry."""

    name: str | None = None
    entry: tuple[str, InstanceType] | None = None
    configured: bool = False  # named in the config (an unknown name is then an error)


# --- Network fabric and PCIe (owner: fabric/preflight work) --------------------------------
# The fabric probe (`node/checks/fabric/fabric.py`) and the simulator build these; the fabric
# rules (`node/checks/fabric/rules.py`) judge them. A value that could not be read is None and
# the reason is in `problems`: the rules turn problems into findings (fail closed).


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
