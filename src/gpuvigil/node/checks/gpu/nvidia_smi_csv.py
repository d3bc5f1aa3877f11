"""`nvidia-smi --query-gpu=... --format=csv` -> GPU readings. Pure, never raises.

Each column is named by the header line (`index, name, pci.bus_id, memory.total [MiB]`),
so the header is required: without it the columns cannot be told apart and the output is
unreadable (CHECK_ERROR). Fields gpuvigil judges are mapped to the same `GpuReading`
fields NVML fills (ECC, retired pages, remapped rows, temperatures, clock-event reasons
under their old `clocks_throttle_reasons.*` and new `clocks_event_reasons.*` names, PCIe
link); the rest are ignored. Values: `[N/A]` / `[Not Supported]` are unknown; `[GPU is
lost]`, `[Unknown Error]` mark the GPU lost; a row with fewer cells than the header is
cut short. nvidia-smi's own errors (lost GPU lines, no driver, no devices) are read by
`nvidia_smi_errors` first.
"""

from __future__ import annotations

import csv
import re
from datetime import datetime
from typing import Any

from gpuvigil.core.findings import utcnow
from gpuvigil.node.catalog import gpus as gpu_catalog
from gpuvigil.node.checks.gpu import nvidia_smi_errors
from gpuvigil.node.checks.gpu.nvidia_smi import REASON_BITS, recovery_action_of
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, ReadError

SOURCE = "nvidia-smi --query-gpu"
# query field (without units) -> (GpuReading field, kind)
_FIELDS: dict[str, tuple[str, str]] = {
    "name": ("name", "str"),
    "uuid": ("uuid", "str"),
    "serial": ("serial", "str"),
    "pci.bus_id": ("pci_bus_id", "bus"),
    "memory.total": ("memory_total_mib", "int"),
    "ecc.mode.current": ("ecc_enabled", "bool"),
    "ecc.mode.pending": ("ecc_pending_enabled", "bool"),
    "ecc.errors.corrected.volatile.total": ("ecc_volatile_corrected", "int"),
    "ecc.errors.uncorrected.volatile.total": ("ecc_volatile_uncorrected", "int"),
    "ecc.errors.corrected.aggregate.total": ("ecc_aggregate_corrected", "int"),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_aggregate_uncorrected", "int"),
    "retired_pages.single_bit_ecc.count": ("retired_sbe", "int"),
    "retired_pages.sbe": ("retired_sbe", "int"),
    "retired_pages.double_bit.count": ("retired_dbe", "int"),
    "retired_pages.dbe": ("retired_dbe", "int"),
    "retired_pages.pending": ("retired_pending", "bool"),
    "remapped_rows.correctable": ("remap_corrected", "int"),
    "remapped_rows.uncorrectable": ("remap_uncorrected", "int"),
    "remapped_rows.pending": ("remap_pending", "bool"),
    "remapped_rows.failure": ("remap_failure", "bool"),
    "temperature.gpu": ("temperature_gpu_c", "float"),
    "temperature.memory": ("temperature_memory_c", "float"),
    "pcie.link.gen.current": ("pcie_gen", "int"),
    "pcie.link.gen.max": ("pcie_gen_max", "int"),
    "pcie.link.width.current": ("pcie_width", "int"),
    "pcie.link.width.max": ("pcie_width_max", "int"),
    "gpu_recovery_action": ("recovery_action", "recovery"),
}
_REASON_PREFIXES = ("clocks_throttle_reasons.", "clocks_event_reasons.")
_UNKNOWN = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown]"}
_LOST = ("[gpu is lost]", "[unknown error]", "[gpu requires reset]")
_NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
KNOWN_HEADERS = frozenset(_FIELDS) | {"index", "count", "driver_version", "timestamp"}


def header_fields(line: str) -> list[str]:
    """The query field names of a header line, units dropped (`memory.total [MiB]`)."""
    return [cell.split(" [", 1)[0].strip().lower() for cell in line.split(",")]


def looks_like_header(line: str) -> bool:
    names = header_fields(line)
    known = sum(1 for n in names if n in KNOWN_HEADERS or n.startswith(_REASON_PREFIXES))
    return known >= 1 and known * 2 >= len(names)


def parse_csv(text: str | bytes, *, observed_at: datetime | None = None) -> GpuInventory:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    observed_at = observed_at or utcnow()
    said = nvidia_smi_errors.scan(text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if looks_like_header(ln)), None)
    if start is None:
        errors = [said.driver] if said.driver else []
        if said.no_devices:
            return GpuInventory(source=SOURCE, observed_at=observed_at, count=0)
        if not errors and not said.lost:
            errors.append(
                ReadError("csv", "Unparsable", "no header line (use --format=csv, not noheader)")
            )
        return GpuInventory(
            source=SOURCE, observed_at=observed_at, gpus=said.lost, errors=tuple(errors)
        )
    names = header_fields(lines[start])
    errors: list[ReadError] = []
    gpus: list[GpuReading] = []
    counts: set[int] = set()
    driver = None
    for row_no, cells in enumerate(csv.reader(lines[start + 1 :], skipinitialspace=True)):
        if nvidia_smi_errors.LOST_LINE.search(",".join(cells)):
            continue  # read by nvidia_smi_errors
        if len(gpus) > nvidia_smi_errors.MAX_GPUS:
            break
        if len(cells) != len(names):
            if len(errors) < 10:
                why = f"row {row_no + 1} has {len(cells)} of {len(names)} cells"
                errors.append(ReadError("csv", "Incomplete", why))
            continue
        values = dict(zip(names, (c.strip() for c in cells), strict=True))
        count = _int(values.get("count"))
        if count is not None:
            counts.add(count)
        driver = driver or _str(values.get("driver_version"))
        gpus.append(_reading(values, default_index=len(gpus)))
    known = {g.pci_bus_id for g in gpus}
    gpus += [g for g in said.lost if g.pci_bus_id not in known]
    gpus = nvidia_smi_errors.capped(gpus, errors)
    attached = max(counts) if counts else None
    if attached is not None and len(gpus) < attached:
        errors.append(
            ReadError("gpu", "Incomplete", f"count says {attached} GPU(s), {len(gpus)} row(s)")
        )
    return GpuInventory(
        source=SOURCE,
        observed_at=observed_at,
        gpus=tuple(gpus),
        count=attached if attached is not None else len(gpus),
        driver_version=driver,
        errors=tuple(errors),
    )


def _reading(values: dict[str, str], *, default_index: int) -> GpuReading:
    fields: dict[str, Any] = {}
    lost = [k for k, v in values.items() if v.lower() in _LOST]
    for name, raw in values.items():
        target = _FIELDS.get(name)
        if target is not None and target[0] not in fields:
            fields[target[0]] = _convert(raw, target[1])
    mask, seen = 0, False
    for name, raw in values.items():
        reason = next((name[len(p) :] for p in _REASON_PREFIXES if name.startswith(p)), None)
        if reason in REASON_BITS:
            state = _convert(raw, "bool")
            seen = seen or state is not None
            mask |= REASON_BITS[reason] if state else 0
    if seen:
        fields["clock_event_reasons"] = mask
    index = _int(values.get("index"))
    product = gpu_catalog.load().lookup(fields.get("name"))
    return GpuReading(
        index=index if index is not None else default_index,
        architecture=product.family if product else None,
        lost=bool(lost),
        errors=tuple(ReadError(k, "Unknown", values[k]) for k in lost),
        **fields,
    )


def _convert(raw: str, kind: str) -> Any:
    low = raw.strip().lower()
    if low in _UNKNOWN or low in _LOST:
        return None
    if kind == "str":
        return raw.strip()
    if kind == "bus":
        return raw.strip().upper()
    if kind == "recovery":
        return recovery_action_of(raw)
    if kind == "bool":
        if low in {"yes", "enabled", "active", "1"}:
            return True
        if low in {"no", "disabled", "not active", "0"}:
            return False
        return None
    m = _NUM.match(low)
    if m is None:
        return None
    return float(m.group(1)) if kind == "float" else int(float(m.group(1)))


def _int(raw: str | None) -> int | None:
    return _convert(raw, "int") if raw is not None else None


def _str(raw: str | None) -> str | None:
    return _convert(raw, "str") if raw is not None else None
