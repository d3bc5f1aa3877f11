"""The plain `nvidia-smi` table (what people paste first) -> `GpuInventory`. Pure; never
raises.

The banner gives the driver (`NVIDIA-SMI 550.90.07  Driver Version: 550.90.07`). Each GPU
is a block of box rows: the first starts with its index (`|   0  NVIDIA H100 80GB HBM3  On
| 00000000:18:00.0 Off | 0 |`) and carries the bus id and the volatile uncorrected ECC
count; the next carries fan, temperature, performance state, power and memory. Cells are
found by what they hold (a bus id, `38C`, `MiB`), not by column position, so the 4xx,
525 and 550+ layouts and their widths read alike. `ERR!` in a cell is nvidia-smi saying it
could not read that field: a read error on that GPU (never healthy); `ERR!` in most cells,
or `Unknown Error` / `GPU is lost` lines, is a lost GPU. The MIG and process tables are not
read. A fragment pasted without the banner and header (GPU rows only) is read for the GPUs
it shows; it does not say how many the node has (`count` unknown). A GPU block the paste
cuts off (a row without its closing `|`, or no `+---+` rule after the last block) is a
table cut short: could not tell, as the GPUs after it are unseen (a post that stops at
the third of eight GPUs must not read as a healthy three-GPU node).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

from gpuvigil.core.findings import utcnow
from gpuvigil.node.catalog import gpus as gpu_catalog
from gpuvigil.node.checks.gpu import nvidia_smi_errors
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, ReadError

SOURCE = "nvidia-smi (table)"
BANNER = re.compile(r"NVIDIA-SMI\s+(?P<smi>[\d.]+)\s+Driver Version:\s*(?P<driver>[\d.]+)")
_FIRST = re.compile(r"^\|\s*(?P<index>\d+)\s+(?P<name>.*?)(?:\s+(?:On|Off|N/A))?\s*$")
_BUS = re.compile(r"\b([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_TEMP = re.compile(r"\b(\d{1,3})C\b")
_MEM = re.compile(r"(\d+)MiB\s*/\s*(\d+)MiB")
# A GPU's first row, whatever the layout: index and name, then its bus id and display cell.
_GPU_ROW = re.compile(
    r"^\|\s*\d+\s+\S.*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\s+(?:On|Off|N/A)\s*\|",
    re.M,
)
_STATS_ROW = re.compile(r"^\|\s*(?:N/A|\d+%)\s+\d{1,3}C\s+P\d+\b.*MiB\s*/\s*\d+MiB", re.M)
_END = re.compile(r"^\|\s*(?:Processes|MIG devices)\s*:", re.I)


def looks_like(text: str) -> bool:
    if BANNER.search(text) is not None and "|" in text:
        return True
    return _GPU_ROW.search(text) is not None and _STATS_ROW.search(text) is not None


def _has_header(text: str) -> bool:
    return re.search(r"^\s*[|+]=", text, re.M) is not None


def parse(text: str, *, observed_at: datetime | None = None) -> GpuInventory:
    banner = BANNER.search(text)
    blocks: list[list[list[str]]] = []  # per GPU: its rows, each a list of cells
    whole = _has_header(text)
    in_table = not whole  # a fragment: its rows are the table
    closed = True  # the last GPU block has its closing rule
    cut = False
    for line in text.splitlines():
        s = line.strip()
        if in_table and s.startswith("+-"):
            closed = True
        if s.startswith("|=") or s.startswith("+="):
            in_table = True
            continue
        if _END.match(s):
            in_table = False
            continue
        if not in_table or not s.startswith("|"):
            continue
        if not s.endswith(("|", "+")):
            cut = True  # a row the paste broke off
        cells = [c.strip() for c in s.strip("|").split("|")]
        if _FIRST.match(f"|{cells[0]}") and _BUS.search(s):
            blocks.append([cells])
            closed = False
        elif blocks and len(blocks[-1]) < 3:
            blocks[-1].append(cells)
    errors: list[ReadError] = []
    if blocks and (cut or not closed):
        errors.append(ReadError("table", "Incomplete", "the table is cut short"))
    gpus = nvidia_smi_errors.capped([_gpu(b) for b in blocks], errors)
    said = nvidia_smi_errors.scan(text)
    # A GPU nvidia-smi says it cannot reach is lost, whether or not the table still lists it.
    lost = {g.pci_bus_id: g for g in said.lost}
    gpus = [
        replace(g, lost=True, errors=g.errors + lost[g.pci_bus_id].errors)
        if g.pci_bus_id in lost
        else g
        for g in gpus
    ]
    known = {g.pci_bus_id for g in gpus}
    gpus += [g for g in said.lost if g.pci_bus_id not in known]
    if said.driver is not None:
        errors.append(said.driver)
    elif not gpus and not said.no_devices:
        errors.append(ReadError("table", "Unparsable", "no GPU rows in the nvidia-smi table"))
    return GpuInventory(
        source=SOURCE,
        observed_at=observed_at or utcnow(),
        gpus=tuple(gpus),
        count=len(gpus) if (gpus and whole) or said.no_devices else None,
        driver_version=banner.group("driver") if banner else None,
        errors=tuple(errors),
    )


def _gpu(rows: list[list[str]]) -> GpuReading:
    first = rows[0]
    m = _FIRST.match(f"|{first[0]}")
    index = int(m.group("index")) if m else -1
    name = m.group("name").strip() if m else None
    bus = _BUS.search(" ".join(first))
    text = " | ".join(c for row in rows for c in row)
    errs = []
    fields = ("name/persistence", "bus id/display", "volatile uncorrected ECC")
    fields2 = ("fan/temperature/performance/power", "memory", "utilisation/compute mode")
    for names, row in ((fields, first), (fields2, rows[1] if len(rows) > 1 else [])):
        for field, cell in zip(names, row, strict=False):
            if "ERR!" in cell:
                errs.append(ReadError(field, "Unknown", f"nvidia-smi printed ERR! for {field}"))
    ecc_cell = first[2] if len(first) > 2 else ""
    ecc = int(ecc_cell) if re.fullmatch(r"\d+", ecc_cell) else None
    temp = _TEMP.search(rows[1][0]) if len(rows) > 1 and rows[1] else None
    mem = _MEM.search(text)
    product = gpu_catalog.load().lookup(name or "")
    return GpuReading(
        index=index,
        name=name,
        pci_bus_id=bus.group(1).upper() if bus else None,
        architecture=product.family if product else None,
        memory_total_mib=int(mem.group(2)) if mem else None,
        ecc_volatile_uncorrected=ecc,
        temperature_gpu_c=float(temp.group(1)) if temp else None,
        lost=text.count("ERR!") >= 4,
        errors=tuple(errs),
    )
