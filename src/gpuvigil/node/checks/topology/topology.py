"""`nvidia-smi topo -m` -> `GpuTopology`. Pure; never raises.

The matrix's header names its columns: `GPU0 ... GPU7`, then the NICs (`NIC0 ...` since
r525, with a `NIC Legend:` naming them `NIC0: mlx5_0`; older drivers print `mlx5_0`
itself), then `CPU Affinity`, `NUMA Affinity` and, on r535+, `GPU NUMA ID`. Columns are
found by name, so extra or reordered columns, tabs or spaces, and any widths read alike.
Each `GPUn` row gives that GPU's link to every other GPU (`X` self, `NV18` 18 bonded
NVLinks, `SYS`/`NODE`/`PHB`/`PXB`/`PIX` PCIe paths).
"""

from __future__ import annotations

import re

from gpuvigil.node.checks.topology.readings import GpuTopology

MAX_DEVICES = 128
_GPU = re.compile(r"^GPU(\d+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # nvidia-smi underlines the header on a terminal
_LEGEND_NIC = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_CELL = re.compile(r"^(?:X|NV\d+|SYS|NODE|PHB|PXB|PIX|SOC|N/A)$")


def header_of(lines: list[str]) -> int | None:
    """The index of the matrix's header line (`GPU0 GPU1 ... CPU Affinity`), or None."""
    for i, line in enumerate(lines[:400]):
        tokens = _ANSI.sub("", line).split()
        if tokens and tokens[0] == "GPU0" and ("Affinity" in tokens or _matrix_follows(lines, i)):
            return i
    return None


def _matrix_follows(lines: list[str], i: int) -> bool:
    nxt = lines[i + 1].split() if i + 1 < len(lines) else []
    return len(nxt) >= 2 and nxt[0] == "GPU0" and nxt[1] == "X"


def parse(text: str) -> GpuTopology:
    lines = _ANSI.sub("", text).splitlines()
    at = header_of(lines)
    if at is None:
        return GpuTopology(problems=("no 'GPU0 ... CPU Affinity' header",))
    columns = _columns(lines[at])
    legend = {m.group(1): m.group(2) for ln in lines if (m := _LEGEND_NIC.match(ln))}
    gpus = [int(m.group(1)) for c in columns if (m := _GPU.match(c))]
    nics = [legend.get(c, c) for c in columns if not _GPU.match(c)]
    pairs: list[tuple[int, int, str]] = []
    problems: list[str] = []
    rows_seen: set[int] = set()
    for line in lines[at + 1 :]:
        tokens = line.split()
        if not tokens or tokens[0] in ("Legend:", "NIC"):
            if tokens[:1] == ["Legend:"]:
                break
            continue
        m = _GPU.match(tokens[0])
        if m is None:
            continue
        index = int(m.group(1))
        cells = tokens[1 : 1 + len(columns)]
        if len(cells) < len(columns) or not all(_CELL.match(c) for c in cells[: len(gpus)]):
            problems.append(f"GPU{index}: row does not match the header: {line.strip()[:160]!r}")
            continue
        rows_seen.add(index)
        for col, cell in zip(columns, cells, strict=False):
            other = _GPU.match(col)
            if other and int(other.group(1)) > index:
                pairs.append((index, int(other.group(1)), cell))
    missing = [g for g in gpus if g not in rows_seen]
    if missing:
        problems.append(f"no matrix row for GPU(s) {missing}")
    return GpuTopology(
        gpus=tuple(gpus[:MAX_DEVICES]),
        nics=tuple(nics[:MAX_DEVICES]),
        pairs=tuple(pairs[: MAX_DEVICES * MAX_DEVICES]),
        problems=tuple(problems[:20]),
    )


def _columns(header: str) -> list[str]:
    out = []
    for token in header.split():
        if token in ("CPU", "NUMA"):  # "CPU Affinity", "NUMA Affinity": not devices
            break
        out.append(token)
    return out[:MAX_DEVICES]
