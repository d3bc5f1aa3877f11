"""Raw NVML answers (as the NVML worker prints them) -> frozen GPU readings.

Pure: called by `gpuvigil.node.checks.gpu.nvml` on the worker's JSON lines, and by tests and
the simulator directly. "Not supported" becomes None; any other NVML error is kept as a
`ReadError` (the rules turn GpuIsLost/Unknown into GPU_LOST and the rest into CHECK_ERROR).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuvigil.node.checks.gpu.readings import (
    LOST_ERRORS,
    GpuInventory,
    GpuReading,
    NvLinkReading,
    ReadError,
)

# nvmlDeviceArchitecture_t -> family name used by the catalogs.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

# Errors that only say "this GPU / driver does not have that": the reading is absent.
_ABSENT = {"NotSupported", "FunctionNotFound", "InvalidArgument", "NotFound", "NoData"}


# nvmlDeviceGpuRecoveryAction_t (nvidia-ml-py NVML_GPU_RECOVERY_ACTION_*).
RECOVERY_ACTIONS = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT",
}


def _recovery(r: _Reader) -> str | None:
    action = r.as_int("recovery_action")
    if action is not None:
        return RECOVERY_ACTIONS.get(action, f"UNKNOWN_{action}")
    drain, reset = r.as_int("drain_and_reset_status"), r.as_int("reset_status")
    if drain:
        return "DRAIN_AND_RESET"
    if reset:
        return "GPU_RESET"
    return "NONE" if drain == 0 or reset == 0 else None


def _is_err(value: Any) -> bool:
    return isinstance(value, dict) and "__err__" in value


class _Reader:
    """Pulls typed values out of one GPU's raw dict, collecting the errors on the way."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.errors: list[ReadError] = []

    def get(self, key: str) -> Any:
        value = self.raw.get(key)
        if _is_err(value):
            if value.get("name") not in _ABSENT:
                self.errors.append(
                    ReadError(key, str(value.get("name")), str(value.get("message", "")))
                )
            return None
        return value

    def as_int(self, key: str) -> int | None:
        return _opt_int(self.get(key))

    def as_str(self, key: str) -> str | None:
        value = self.get(key)
        return value.strip() or None if isinstance(value, str) else None

    def flag(self, key: str) -> bool | None:
        value = self.as_int(key)
        return None if value is None else bool(value)


def gpu_from_raw(index: int, raw: dict[str, Any]) -> GpuReading:
    r = _Reader(raw)
    ecc_mode = r.get("ecc_mode")
    ecc_cur = ecc_pend = None
    if isinstance(ecc_mode, list) and len(ecc_mode) == 2:
        ecc_cur, ecc_pend = bool(ecc_mode[0]), bool(ecc_mode[1])
    remap = r.get("remapped_rows")
    remap_vals: list[Any] = remap if isinstance(remap, list) and len(remap) == 4 else [None] * 4
    arch = r.as_int("architecture")
    total = r.as_int("memory_total")
    raw_links = raw.get("nvlinks") if isinstance(raw.get("nvlinks"), list) else []
    links = tuple(_link(entry, r) for entry in raw_links if isinstance(entry, dict))
    bus = r.as_str("pci")
    return GpuReading(
        index=index,
        name=r.as_str("name"),
        uuid=r.as_str("uuid"),
        serial=r.as_str("serial"),
        pci_bus_id=bus.upper() if bus else None,
        architecture=ARCHITECTURES.get(arch) if arch is not None else None,
        memory_total_mib=total >> 20 if total is not None else None,
        ecc_enabled=ecc_cur,
        ecc_pending_enabled=ecc_pend,
        ecc_volatile_corrected=r.as_int("ecc_volatile_corrected"),
        ecc_volatile_uncorrected=r.as_int("ecc_volatile_uncorrected"),
        ecc_aggregate_corrected=r.as_int("ecc_aggregate_corrected"),
        ecc_aggregate_uncorrected=r.as_int("ecc_aggregate_uncorrected"),
        retired_sbe=r.as_int("retired_sbe"),
        retired_dbe=r.as_int("retired_dbe"),
        retired_pending=r.flag("retired_pending"),
        remap_corrected=_opt_int(remap_vals[0]),
        remap_uncorrected=_opt_int(remap_vals[1]),
        remap_pending=_opt_bool(remap_vals[2]),
        remap_failure=_opt_bool(remap_vals[3]),
        temperature_gpu_c=_opt_float(r.as_int("temperature_gpu")),
        temperature_memory_c=_opt_float(r.as_int("temperature_memory")),
        slowdown_temp_c=_opt_float(r.as_int("threshold_slowdown")),
        shutdown_temp_c=_opt_float(r.as_int("threshold_shutdown")),
        memory_max_temp_c=_opt_float(r.as_int("threshold_mem_max")),
        clock_event_reasons=r.as_int("clock_event_reasons"),
        pcie_gen=r.as_int("pcie_gen"),
        pcie_gen_max=r.as_int("pcie_gen_max"),
        pcie_width=r.as_int("pcie_width"),
        pcie_width_max=r.as_int("pcie_width_max"),
        nvlinks=links,
        recovery_action=_recovery(r),
        lost=any(e.error in LOST_ERRORS for e in r.errors),
        errors=tuple(r.errors),
    )


_LINK_FIELDS = ("state", "replay", "recovery", "crc_flit", "crc_data")


def _link(entry: dict[str, Any], r: _Reader) -> NvLinkReading:
    link = entry.get("link") if isinstance(entry.get("link"), int) else -1
    values = [entry.get(k) for k in _LINK_FIELDS]
    if all(type(v) is int for v in values):  # the common case: every counter answered
        state, replay, recovery, crc_flit, crc_data = values
        return NvLinkReading(link, bool(state), replay, recovery, crc_flit, crc_data)
    sub = _Reader(entry)
    state = sub.flag("state")
    reading = NvLinkReading(
        link=link,
        active=state,
        replay=sub.as_int("replay"),
        recovery=sub.as_int("recovery"),
        crc_flit=sub.as_int("crc_flit"),
        crc_data=sub.as_int("crc_data"),
    )
    r.errors.extend(ReadError(f"nvlink{link}.{e.field}", e.error, e.message) for e in sub.errors)
    return reading


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_bool(value: Any) -> bool | None:
    return bool(value) if isinstance(value, int) else None


def _opt_float(value: int | None) -> float | None:
    return float(value) if value is not None else None


def inventory_from_lines(lines: list[dict[str, Any]], *, observed_at: datetime) -> GpuInventory:
    """The worker's answers to a snapshot (possibly several requests, when a GPU that hung
    was skipped: the client adds a `{"gpu": i, "timeout": ...}` line for it)."""
    gpus: dict[int, GpuReading] = {}
    errors: list[ReadError] = []
    count: int | None = None
    driver: str | None = None
    for line in lines:
        if not isinstance(line, dict):
            continue
        if line.get("done") or ("count" in line and "gpu" not in line):
            c, d = line.get("count"), line.get("driver_version")
            count = c if isinstance(c, int) else count
            driver = d if isinstance(d, str) else driver
            if _is_err(c) and line.get("done"):
                errors.append(ReadError("device_count", str(c.get("name")), str(c.get("message"))))
            continue
        index = line.get("gpu")
        if not isinstance(index, int):
            continue
        reading = _gpu_line(index, line)
        if reading is not None:
            gpus[index] = reading
    return GpuInventory(
        source="nvml",
        observed_at=observed_at,
        gpus=tuple(gpus[i] for i in sorted(gpus)),
        count=count,
        driver_version=driver,
        errors=tuple(errors),
    )


def _gpu_line(index: int, line: dict[str, Any]) -> GpuReading | None:
    if "timeout" in line:
        t = line["timeout"] if isinstance(line["timeout"], dict) else {}
        err = ReadError(str(t.get("field", "gpu")), "Timeout", str(t.get("message", "")))
        return GpuReading(index=index, errors=(err,))
    if "handle_error" in line:
        e = line["handle_error"] if isinstance(line["handle_error"], dict) else {}
        err = ReadError("handle", str(e.get("name")), str(e.get("message", "")))
        return GpuReading(index=index, lost=err.error in LOST_ERRORS, errors=(err,))
    if isinstance(line.get("raw"), dict):
        try:
            return gpu_from_raw(index, line["raw"])
        except Exception as e:  # noqa: BLE001 - a malformed answer is an error, not a crash
            err = ReadError("raw", "Unparsable", f"{type(e).__name__}: {e}")
            return GpuReading(index=index, errors=(err,))
    return None
