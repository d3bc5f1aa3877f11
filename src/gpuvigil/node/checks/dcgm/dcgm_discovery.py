"""`dcgmi discovery -l [-a]` -> the GPUs DCGM's host engine sees, as a GpuInventory. Pure.

The output is `N GPUs found.` and a two-column table, one block per GPU: the GPU id, then
`Name: ...`, `PCI Bus ID: ...`, `Device UUID: ...` rows (the name reads `<<<NULL>>>` when
the host engine could not get it). With `-a`, inactive GPUs are listed too, with a
`Status: <state>` row and `(last known)` after their cached name and bus id: such a GPU
is lost. NvSwitch, ConnectX and CPU tables follow and are not GPUs.

Never raises: a count that disagrees with the rows, or output without the `GPUs found`
line (a host-engine error), becomes a ReadError on the inventory (CHECK_ERROR).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from gpuvigil.core.findings import utcnow
from gpuvigil.node.checks.gpu import nvidia_smi_errors
from gpuvigil.node.checks.gpu.nvidia_smi_errors import MAX_GPUS
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, ReadError

SOURCE = "dcgmi discovery"
_FOUND = re.compile(r"^\s*(\d+)\s+(GPUs?|NvSwitch(?:es)?|ConnectX|CPUs?)\b.*found", re.I)
_ROW = re.compile(r"^\s*\|\s*([^|]*?)\s*\|\s*(.*?)\s*\|\s*$")
_ONE = re.compile(r"^\s*\|\s*([^|]*?)\s*\|\s*$")  # the one-column NvSwitch table
_LAST_KNOWN = re.compile(r"\s*\(last known\)\s*$", re.I)
_NULL = "<<<NULL>>>"


@dataclass
class _Gpu:
    index: int
    fields: dict[str, str] = field(default_factory=dict)


def parse_discovery(text: str | bytes, *, observed_at: datetime | None = None) -> GpuInventory:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    count: int | None = None
    table: str | None = None
    gpus: list[_Gpu] = []
    others: dict[str, list[int]] = {}  # NvSwitch/ConnectX/CPU tables: [said, listed]
    closed = True  # the GPU block read last ended with its border line
    for line in text.splitlines():
        if line.strip().startswith("+-") and table is not None and table.startswith("gpu"):
            closed = True
            continue
        found = _FOUND.match(line)
        if found:
            table = found.group(2).lower()
            if table.startswith("gpu"):
                count = int(found.group(1))
            else:
                others[table] = [int(found.group(1)), 0]
            continue
        row = _ROW.match(line) or _ONE.match(line)
        if row is None or table is None:
            continue
        if not table.startswith("gpu"):
            others[table][1] += row.group(1).strip().isdigit()
            continue
        gid, info = row.group(1), row.group(2) if row.re is _ROW else ""
        closed = False
        if gid.isdigit():
            gpus.append(_Gpu(int(gid)))
        if gpus and ":" in info:
            key, _, value = info.partition(":")
            gpus[-1].fields[key.strip().lower()] = value.strip()
    errors: list[ReadError] = []
    if count is None:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        errors.append(ReadError("discovery", "Unparsable", f"no 'GPUs found' line: {first[:200]}"))
    elif len(gpus) != count:
        errors.append(
            ReadError(
                "discovery",
                "Incomplete",
                f"dcgmi says {count} GPU(s) were found but lists {len(gpus)}",
            )
        )
    if gpus and not closed:
        errors.append(ReadError("discovery", "Incomplete", "the GPU table is cut short"))
    for name, (said, listed) in others.items():
        if listed < said:  # the output was cut short after the GPUs
            errors.append(
                ReadError("discovery", "Incomplete", f"{said} {name} found, {listed} listed")
            )
    readings = nvidia_smi_errors.capped([_reading(g) for g in gpus[: MAX_GPUS + 1]], errors)
    return GpuInventory(
        source=SOURCE,
        observed_at=observed_at or utcnow(),
        gpus=tuple(readings),
        count=count,
        errors=tuple(errors),
    )


def _reading(g: _Gpu) -> GpuReading:
    def value(key: str) -> str | None:
        text = _LAST_KNOWN.sub("", g.fields.get(key, ""))
        return None if text in ("", _NULL) else text

    status = g.fields.get("status")
    lost = status is not None and status.strip().lower() not in ("ok", "")
    bus = value("pci bus id")
    return GpuReading(
        index=g.index,
        name=value("name"),
        uuid=value("device uuid"),
        pci_bus_id=bus.upper() if bus else None,
        lost=lost,
        errors=(ReadError("status", "Unknown", f"DCGM status {status}"),) if lost else (),
    )
