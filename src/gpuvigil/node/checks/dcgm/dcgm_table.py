"""The text table of `dcgmi diag -r N` (no `-j`), DCGM 2.x-4.x -> a DcgmReport. Pure.

The layout, as `dcgmi/Diag.cpp` prints it: a two-column table (`| name | value |`) with
section rows (`|-----  Deployment  ----|`, `+-----  Hardware  ----+`); a test row whose
value is `Pass`, `Fail - GPU: 2`, `Pass - GPUs: 0, 1` (3.x, one row per outcome, later
rows with an empty name) or a summary followed by `GPU0: Fail` rows (4.x); then, for a
test that did not pass, `Warning` / `Info` / `Error` cells whose text is cut into
45-character pieces, one per row, every piece after the first with an empty name. A piece
is text, whatever it starts with: only a row that is exactly a status is a status row.

Deployment tests (one node-wide verdict) name the GPU they failed on only in their Error
text ("Persistence mode for GPU 0 is disabled"); such a result is pinned to that GPU.

Never raises. What cannot be read makes the report incomplete, and keeps every verdict
that was read (a wrapped cell never hides the `Fail - GPU: n` rows above it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuvigil.node.checks.dcgm.readings import DcgmReport, DcgmResult

_ROW = re.compile(r"^\s*[|+]\s?(.*?)\s*\|\s?(.*?)\s*[|+]\s*$")
_SECTION = re.compile(r"^\s*[|+]-+\s*([A-Za-z][\w /]*?)\s*-+\+")
_RULE = re.compile(r"^\s*\+[-=+]+\+\s*$")
_STATUS_WORD = r"(Pass|Fail|Warn|Skip|Not Run|Incomplete)"
# "Pass", "Fail - All", "Pass - GPUs: 0, 1, 3", "Fail - GPU: 2"
_STATUS = re.compile(rf"^{_STATUS_WORD}(?:\s*-\s*(All|GPUs?\s*:\s*[\d,\s]+?))?\s*$", re.I)
# DCGM 4.x per-entity rows under a test's summary: "GPU0: Fail", "GPU 3: Pass"
_PER_GPU = re.compile(rf"^GPU\s*(\d+)\s*:\s*{_STATUS_WORD}\s*$", re.I)
_CELL = re.compile(r"^(Warning|Info|Error|Training Result)\b\s*:?\s*(.*)$", re.I)
_GPU_REF = re.compile(r"\bGPU\s*(?:ID\s*:?\s*)?(\d{1,3})\b", re.I)
_WORDS = {
    "pass": "Pass",
    "fail": "Fail",
    "warn": "Warn",
    "skip": "Skip",
    "not run": "Skip",
    "incomplete": "Incomplete",
}
_MAX_INFO = 500


@dataclass
class _Cell:
    """A Warning/Info/Error cell being read, piece by piece."""

    kind: str
    test: str | None
    gpu: int | None
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.pieces).strip()


@dataclass
class _Table:
    results: list[DcgmResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    section: str = ""
    test: str | None = None
    deployment: set[str] = field(default_factory=set)
    cell: _Cell | None = None

    def close_cell(self) -> None:
        cell, self.cell = self.cell, None
        if cell is None or not cell.text or cell.test is None:
            return
        gpu = cell.gpu
        if gpu is None:
            m = _GPU_REF.search(cell.text)
            gpu = int(m.group(1)) if m else None
        if cell.kind == "error" and cell.test in self.deployment and gpu is not None:
            _pin(self.results, cell.test, gpu)
        attach(self.results, cell.test, gpu, cell.text)


def parse_table(text: str, *, level: int | None = None) -> DcgmReport:
    t = _Table()
    saw_table = closed = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        sm = _SECTION.match(line)
        if sm:
            t.close_cell()
            t.section, t.test, saw_table, closed = sm.group(1).strip().lower(), None, True, False
            continue
        if _RULE.match(line):
            t.close_cell()
            closed, saw_table = saw_table and t.section != "", True
            continue
        row = _ROW.match(line)
        if row is None:
            if line.lower().startswith("error"):
                t.errors.append(line[:300])
            continue
        closed = False
        _row(t, row.group(1).strip(), row.group(2).strip())
    t.close_cell()
    errors = t.errors
    if not t.results:
        errors.append("no test results in the table")
    elif saw_table and not closed:
        errors.append("the table is cut short")
    return DcgmReport(
        kind="diag",
        results=tuple(t.results),
        overall=overall(t.results),
        complete=not errors,
        errors=tuple(errors),
        level=level,
    )


def _row(t: _Table, name: str, value: str) -> None:
    if name == "Diagnostic" and value == "Result":
        return  # the header row; "Diagnostic" is also a test name (r3 of DCGM 2.x/3.x)
    if t.section == "metadata":
        return
    cell = _CELL.match(name) if name else None
    if cell is not None:
        t.close_cell()
        named = _GPU_REF.search(cell.group(2))
        t.cell = _Cell(
            cell.group(1).lower(), t.test, int(named.group(1)) if named else None, [value]
        )
        return
    if name:
        t.close_cell()
        t.test = name
        if t.section == "deployment":
            t.deployment.add(name)
        _status_row(t, value, first=True)
        return
    # An empty name: a piece of the open cell, unless it is exactly a status row.
    if t.cell is not None and not (_STATUS.match(value) or _PER_GPU.match(value)):
        t.cell.pieces.append(value)
        return
    t.close_cell()
    if value.startswith("Code:"):  # the EUD return code printed under "Warn - All"
        attach(t.results, t.test, None, value, any_result=True)
        return
    _status_row(t, value, first=False)


def _status_row(t: _Table, value: str, *, first: bool) -> None:
    test = t.test
    if test is None:
        return
    per_gpu = _PER_GPU.match(value)
    if per_gpu:  # 4.x: the per-GPU verdicts replace the test's node-wide summary row
        t.results = [r for r in t.results if not (r.test == test and r.gpu is None)]
        t.results.append(DcgmResult(test, _word(per_gpu.group(2)), int(per_gpu.group(1))))
        return
    m = _STATUS.match(value)
    if m is None:
        if first or value:
            t.errors.append(f"{test}: unreadable result {value[:80]!r}")
        return
    status, scope = _word(m.group(1)), m.group(2) or ""
    gpus = [int(x) for x in re.findall(r"\d+", scope)]
    if gpus:
        t.results.extend(DcgmResult(test, status, g) for g in gpus)
    else:
        t.results.append(DcgmResult(test, status, None))


def _word(text: str) -> str:
    return _WORDS.get(text.strip().lower(), "Incomplete")


def _pin(results: list[DcgmResult], test: str, gpu: int) -> None:
    """A node-wide verdict whose error names one GPU becomes that GPU's verdict."""
    for i, r in enumerate(results):
        if r.test == test and r.gpu is None and r.result != "Pass":
            results[i] = DcgmResult(r.test, r.result, gpu, r.info)


def attach(
    results: list[DcgmResult],
    test: str | None,
    gpu: int | None,
    info: str,
    *,
    any_result: bool = False,
) -> None:
    """Add a message to the latest matching verdict that did not pass (or any verdict)."""
    for i in range(len(results) - 1, -1, -1):
        r = results[i]
        if r.test != test or (gpu is not None and r.gpu not in (gpu, None)):
            continue
        if r.result != "Pass" or any_result:
            joined = f"{r.info}; {info}" if r.info else info
            results[i] = DcgmResult(r.test, r.result, r.gpu, joined[:_MAX_INFO])
            return


def pin_named_gpus(results: list[DcgmResult]) -> list[DcgmResult]:
    """JSON form of the deployment rule: a node-wide failed verdict whose message names
    exactly one GPU is that GPU's verdict."""
    out = []
    for r in results:
        named = {int(x) for x in _GPU_REF.findall(r.info)} if r.gpu is None else set()
        if r.result != "Pass" and len(named) == 1:
            out.append(DcgmResult(r.test, r.result, named.pop(), r.info))
        else:
            out.append(r)
    return out


def overall(results: list[DcgmResult]) -> str | None:
    if not results:
        return None
    order = ["Pass", "Skip", "Warn", "Incomplete", "Fail"]
    return max((r.result for r in results), key=order.index)
