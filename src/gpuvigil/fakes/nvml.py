"""A fake `pynvml` (nvidia-ml-py): exactly the subset gpuvigil calls, driven by a FakeNode.

Same function names, constants and error classes as nvidia-ml-py (values checked against
nvidia-ml-py 12.x/13.x `pynvml.py`), so `gpuvigil.node.checks.gpu.nvml_worker` loads it by
name (`node.gpu.nvml_module: gpuvigil.fakes.nvml`) and runs the production code path.

The node comes from, in order: `install(node)` (in-process: tests, the simulator), else the
scenario file named by `GPUVIGIL_FAKE_NVML_SCENARIO` (JSON or YAML, see
`gpuvigil.fakes.gpu.FakeNode`), re-read when the file has changed so a test can inject a
fault into an agent running in another process: checked at init, at the device count, at
each GPU's handle (where a GPU's reads begin) and while a GPU hangs, not on every one of
the ~120 calls a GPU's reading takes (that made the fake cost more CPU than the agent).

Failure switches: `FakeNode.library_present=False` -> LibraryNotFound at init,
`driver_loaded=False` -> DriverNotLoaded, `init_hang` -> nvmlInit blocks; per GPU `lost`
-> GpuIsLost on every call, `hang` -> every call blocks until the switch is cleared,
`errors={"nvmlDeviceGetRemappedRows": 999, "*": 15}` -> that NVML error from that call.
"""

from __future__ import annotations

import os
import string
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpuvigil.fakes.gpu import SCENARIO_ENV, FakeGpu, FakeNode

# --- Constants (values as in nvidia-ml-py) -------------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3

NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1

NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3

NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_RESET_STATUS = 226
NVML_FI_DEV_DRAIN_AND_RESET_STATUS = 227
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_VALUE_TYPE_UNSIGNED_INT = 1

NVML_DEVICE_ARCH_VOLTA = 5
NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_ADA = 8
NVML_DEVICE_ARCH_HOPPER = 9
NVML_DEVICE_ARCH_BLACKWELL = 10

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeNone = 0x0

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonNone = 0x0
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown


# --- Errors: NVMLError with one subclass per code, as nvidia-ml-py generates them ----------
class NVMLError(Exception):
    _valClassMapping: dict[int, type[NVMLError]] = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        # Like pynvml: NVMLError(15) builds the NVMLError_GpuIsLost subclass.
        target = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(target)
        obj.value = value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (NVMLError, (self.value,))


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        value = getattr(module, name)
        cls_name = "NVMLError_" + string.capwords(name[len("NVML_ERROR_") :], "_").replace("_", "")

        def new(cls: type, *args: Any, _v: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _v)

        cls = type(cls_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        setattr(module, cls_name, cls)
        NVMLError._valClassMapping[value] = cls


_make_error_classes()


# --- Where the node comes from -------------------------------------------------------------
_lock = threading.RLock()
_installed: FakeNode | None = None
_cache: tuple[str, int, int, FakeNode] | None = None  # path, mtime_ns, size, node
_initialized = 0
_HANG_POLL_S = 0.05


def install(node: FakeNode | None) -> None:
    """Drive this module from `node` in this process (None: back to the scenario file)."""
    global _installed, _initialized
    with _lock:
        _installed = node
        _initialized = 0


def _node(*, fresh: bool = True) -> FakeNode:
    """The scenario as last written. `fresh=False`: the one read at the GPU's handle call
    (a driver answers a GPU's reads in microseconds; checking the file on each of the ~120
    calls a GPU takes made the fake cost more CPU than the agent it feeds)."""
    global _cache
    if _installed is not None:
        return _installed
    if not fresh and _cache is not None:
        return _cache[3]
    path = os.environ.get(SCENARIO_ENV)
    if not path:
        # No scenario: behave like a machine without the NVIDIA library.
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    try:
        st = os.stat(path)
    except OSError:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None
    with _lock:
        if _cache and _cache[:3] == (path, st.st_mtime_ns, st.st_size):
            return _cache[3]
        node = FakeNode.load(Path(path))
        _cache = (path, st.st_mtime_ns, st.st_size, node)
        return node


_present_of: tuple[FakeNode, list[FakeGpu]] | None = None


def _present(node: FakeNode) -> list[FakeGpu]:
    """The GPUs on the bus. Kept per scenario load: every NVML call asks, and a real
    driver answers in C what this Python would otherwise rebuild ~1,000 times a sweep (an
    installed node, which tests change in place, is read afresh)."""
    global _present_of
    if _installed is not None:
        return [g for g in node.gpus if g.present]
    cached = _present_of
    if cached is None or cached[0] is not node:
        cached = _present_of = (node, [g for g in node.gpus if g.present])
    return cached[1]


@dataclass(frozen=True)
class _Handle:
    index: int


def _gpu(handle: _Handle, fn: str) -> FakeGpu:
    """The GPU behind `handle`, after its failure switches for `fn` have had their say."""
    if not _initialized:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    fresh = fn == "nvmlDeviceGetHandleByIndex"  # a GPU's reads start there
    while True:
        node = _node(fresh=fresh)
        gpus = _present(node)
        if not isinstance(handle, _Handle) or handle.index >= len(gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[handle.index]
        if not gpu.hang:
            break
        fresh = True
        time.sleep(_HANG_POLL_S)  # a hung driver call; cleared only by rewriting the scenario
    if gpu.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    code = gpu.errors.get(fn, gpu.errors.get("*"))
    if code:
        raise NVMLError(code)
    return gpu


# --- Init and system -----------------------------------------------------------------------
def nvmlInitWithFlags(flags: int) -> None:
    global _initialized
    while True:
        node = _node()
        if not node.init_hang:
            break
        time.sleep(_HANG_POLL_S)
    if not node.library_present:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    if not node.driver_loaded:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    with _lock:
        _initialized += 1


def nvmlInit() -> None:
    nvmlInitWithFlags(0)


def nvmlShutdown() -> None:
    global _initialized
    with _lock:
        if not _initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _initialized -= 1


def _require_init() -> FakeNode:
    if not _initialized:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _node()


def nvmlSystemGetDriverVersion() -> str:
    return _require_init().driver_version


def nvmlSystemGetNVMLVersion() -> str:
    return _require_init().nvml_version


def nvmlDeviceGetCount() -> int:
    return sum(1 for g in _require_init().gpus if g.present)


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    handle = _Handle(int(index))
    _gpu(handle, "nvmlDeviceGetHandleByIndex")
    return handle


# --- Identity ------------------------------------------------------------------------------
def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetIndex").index


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _gpu(handle, "nvmlDeviceGetName").name


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return _gpu(handle, "nvmlDeviceGetUUID").uuid


def nvmlDeviceGetSerial(handle: _Handle) -> str:
    return _gpu(handle, "nvmlDeviceGetSerial").serial


def nvmlDeviceGetPciInfo(handle: _Handle) -> SimpleNamespace:
    bus_id = _gpu(handle, "nvmlDeviceGetPciInfo").pci_bus_id
    domain, bus, rest = bus_id.split(":")
    return SimpleNamespace(
        busId=bus_id,
        busIdLegacy=bus_id[4:],
        domain=int(domain, 16),
        bus=int(bus, 16),
        device=int(rest.split(".")[0], 16),
        pciDeviceId=0x233010DE,
        pciSubSystemId=0x16C110DE,
    )


def nvmlDeviceGetArchitecture(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetArchitecture").architecture


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> SimpleNamespace:
    total = _gpu(handle, "nvmlDeviceGetMemoryInfo").memory_total_mib << 20
    return SimpleNamespace(total=total, free=total, used=0)


# --- Memory errors -------------------------------------------------------------------------
def nvmlDeviceGetEccMode(handle: _Handle) -> list[int]:
    gpu = _gpu(handle, "nvmlDeviceGetEccMode")
    if not gpu.ecc_supported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_FEATURE_ENABLED if gpu.ecc_enabled else NVML_FEATURE_DISABLED
    return [mode, mode]


def nvmlDeviceGetTotalEccErrors(handle: _Handle, errorType: int, counterType: int) -> int:
    gpu = _gpu(handle, "nvmlDeviceGetTotalEccErrors")
    if not gpu.ecc_supported or not gpu.ecc_enabled:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    scope = "volatile" if counterType == NVML_VOLATILE_ECC else "aggregate"
    kind = "corrected" if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
    return int(getattr(gpu, f"ecc_{scope}_{kind}"))


def nvmlDeviceGetRetiredPages(device: _Handle, sourceFilter: int) -> list[int]:
    gpu = _gpu(device, "nvmlDeviceGetRetiredPages")
    if not gpu.retired_pages_supported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    dbe = sourceFilter == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    return list(gpu.retired_dbe if dbe else gpu.retired_sbe)


def nvmlDeviceGetRetiredPagesPendingStatus(device: _Handle) -> int:
    gpu = _gpu(device, "nvmlDeviceGetRetiredPagesPendingStatus")
    if not gpu.retired_pages_supported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED if gpu.retired_pending else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(device: _Handle) -> tuple[int, int, int, int]:
    gpu = _gpu(device, "nvmlDeviceGetRemappedRows")
    if not gpu.remap_supported:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return (
        gpu.remap_corrected,
        gpu.remap_uncorrected,
        int(gpu.remap_pending),
        int(gpu.remap_failure),
    )


# --- Thermal and clocks --------------------------------------------------------------------
def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    gpu = _gpu(handle, "nvmlDeviceGetTemperature")
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpu.temperature_gpu_c


def nvmlDeviceGetTemperatureThreshold(handle: _Handle, threshold: int) -> int:
    gpu = _gpu(handle, "nvmlDeviceGetTemperatureThreshold")
    values = {
        NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.shutdown_threshold_c,
        NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.slowdown_threshold_c,
        NVML_TEMPERATURE_THRESHOLD_MEM_MAX: gpu.memory_max_threshold_c,
        NVML_TEMPERATURE_THRESHOLD_GPU_MAX: gpu.slowdown_threshold_c,
    }
    if threshold not in values:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return values[threshold]


def nvmlDeviceGetFieldValues(handle: _Handle, fieldIds: list[Any]) -> list[SimpleNamespace]:
    """Memory temperature and the recovery-action fields are modelled; other fields answer
    NotSupported per value, as the real call does."""
    gpu = _gpu(handle, "nvmlDeviceGetFieldValues")
    values = {
        NVML_FI_DEV_MEMORY_TEMP: gpu.temperature_memory_c,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: gpu.recovery_action,
        NVML_FI_DEV_RESET_STATUS: int(gpu.recovery_action in (1, 2)),
        NVML_FI_DEV_DRAIN_AND_RESET_STATUS: int(gpu.recovery_action == 4),
    }
    out = []
    for fid in fieldIds:
        field_id, scope = fid if isinstance(fid, tuple) else (fid, 0)
        ok = field_id in values
        out.append(
            SimpleNamespace(
                fieldId=field_id,
                scopeId=scope,
                timestamp=int(time.time() * 1e6),
                latencyUsec=0,
                valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                nvmlReturn=NVML_SUCCESS if ok else NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=values.get(field_id, 0)),
            )
        )
    return out


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons


# --- PCIe ----------------------------------------------------------------------------------
def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    return _gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max


# --- NVLink --------------------------------------------------------------------------------
def _link(device: _Handle, link: int, fn: str) -> Any:
    gpu = _gpu(device, fn)
    if not 0 <= link < NVML_NVLINK_MAX_LINKS:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if link >= len(gpu.nvlinks):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return gpu.nvlinks[link]


def nvmlDeviceGetNvLinkState(device: _Handle, link: int) -> int:
    active = _link(device, link, "nvmlDeviceGetNvLinkState").active
    return NVML_FEATURE_ENABLED if active else NVML_FEATURE_DISABLED


_COUNTERS = {
    NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}


def nvmlDeviceGetNvLinkErrorCounter(device: _Handle, link: int, counter: int) -> int:
    state = _link(device, link, "nvmlDeviceGetNvLinkErrorCounter")
    if counter not in _COUNTERS:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(getattr(state, _COUNTERS[counter]))


# --- Events (Xid) --------------------------------------------------------------------------
class _EventSet:
    """Registered devices and, per GPU uuid, how many of its Xids were delivered already:
    each event is delivered once per event set, as the driver does."""

    def __init__(self) -> None:
        self.devices: dict[int, int] = {}  # handle index -> event type mask
        self.delivered: dict[str, int] = {}


def nvmlEventSetCreate() -> _EventSet:
    _require_init()
    return _EventSet()


def nvmlDeviceGetSupportedEventTypes(handle: _Handle) -> int:
    _gpu(handle, "nvmlDeviceGetSupportedEventTypes")
    return nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError


def nvmlDeviceRegisterEvents(handle: _Handle, eventTypes: int, eventSet: _EventSet) -> None:
    gpu = _gpu(handle, "nvmlDeviceRegisterEvents")
    eventSet.devices[handle.index] = eventTypes
    # Events raised before registration are not delivered (as with the real driver).
    eventSet.delivered.setdefault(gpu.uuid, len(gpu.xids))


def nvmlEventSetWait_v2(eventSet: _EventSet, timeoutms: int) -> SimpleNamespace:
    deadline = time.monotonic() + max(0, timeoutms) / 1000
    while True:
        node = _require_init()
        present = [g for g in node.gpus if g.present]
        for index, mask in sorted(eventSet.devices.items()):
            if index >= len(present) or not mask & nvmlEventTypeXidCriticalError:
                continue
            gpu = present[index]
            seen = eventSet.delivered.get(gpu.uuid, 0)
            if seen < len(gpu.xids):
                eventSet.delivered[gpu.uuid] = seen + 1
                return SimpleNamespace(
                    device=_Handle(index),
                    eventType=nvmlEventTypeXidCriticalError,
                    eventData=gpu.xids[seen].code,
                    gpuInstanceId=0xFFFFFFFF,
                    computeInstanceId=0xFFFFFFFF,
                )
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(min(_HANG_POLL_S, max(0.0, deadline - time.monotonic())))


def nvmlEventSetWait(eventSet: _EventSet, timeoutms: int) -> SimpleNamespace:
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet: _EventSet) -> None:
    eventSet.devices.clear()
