"""Parsers for `dcgmi health -c` and `dcgmi diag -r N`, JSON (`-j`) and text tables.

Layouts handled: diag JSON of DCGM 3.x (`"DCGM GPU Diagnostic"`, results keyed `gpu_id` or
`gpu_ids`, warnings as strings) and 4.x (`"DCGM Diagnostic"`, results keyed
`entity_group`/`entity_id`, warnings as objects, `test_summary`, `runtime_error`); diag
tables of 2.x-4.x (`probes.dcgm_table`); health JSON (`body` tree of `value`/`children`) and
its text table (`Overall Health`, `GPU ID: n`, `<system>: <state>` rows, or the 4.x tree
`GPU` / `-> n` / `-> <name> system`).

Never raises: what cannot be read makes the report incomplete (`complete=False`), which
the rules turn into "could not tell" (CHECK_ERROR) beside every verdict that was read;
never a pass. A deployment verdict whose message names one GPU is pinned to it. Called
by `probes.dcgm` and `gpuvigil analyze`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpuvigil.node.probes.dcgm_table import attach, overall, parse_table, pin_named_gpus
from gpuvigil.node.readings import DcgmReport, DcgmResult

_STATUS = {
    "pass": "Pass",
    "passed": "Pass",
    "fail": "Fail",
    "failed": "Fail",
    "failure": "Fail",
    "warn": "Warn",
    "warning": "Warn",
    "skip": "Skip",
    "skipped": "Skip",
    "not run": "Skip",
    "healthy": "Pass",
}
_GPU_ONE = re.compile(r"\bGPU\s*(?:ID:?\s*)?(\d+)\b", re.I)
_ROW = re.compile(r"^\s*[|+]\s*(.*?)\s*\|\s*(.*?)\s*[|+]\s*$")


def status_of(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    return _STATUS.get(text.strip().lower())


def _json_doc(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start : text.rfind("}") + 1])
    except (ValueError, RecursionError):
        return None


# --- diag ------------------------------------------------------------------------------------
def parse_diag(data: str | bytes, *, level: int | None = None) -> DcgmReport:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    doc = _json_doc(text)
    if isinstance(doc, dict):
        return _diag_json(doc, level=level)
    return parse_table(text, level=level)


def _warnings(entry: dict[str, Any]) -> str:
    out = []
    for key in ("warnings", "info"):
        items = entry.get(key)
        for w in items if isinstance(items, list) else [items] if items else []:
            out.append(str(w.get("warning", w)) if isinstance(w, dict) else str(w))
    return "; ".join(out)[:500]


def _gpus_of(entry: dict[str, Any]) -> list[int | None]:
    if entry.get("entity_group") not in (None, "GPU"):
        return []  # a CPU or switch entity: not ours to judge here
    raw = entry.get("entity_id", entry.get("gpu_id", entry.get("gpu_ids")))
    if isinstance(raw, int):
        return [raw]
    if isinstance(raw, str):
        ids = [int(x) for x in re.findall(r"\d+", raw)]
        return [ids[0]] if len(ids) == 1 else [None]  # "0,1,2": one node-wide result
    return [None]


def _diag_json(doc: dict[str, Any], *, level: int | None) -> DcgmReport:
    root = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") or doc
    errors: list[str] = []
    results: list[DcgmResult] = []
    if not isinstance(root, dict):
        return DcgmReport(kind="diag", complete=False, errors=("no diagnostic object",))
    runtime = root.get("runtime_error") or doc.get("runtime_error")
    if runtime:
        errors.append(f"runtime error: {runtime}")
    tests: list[Any] = []
    cats = root.get("test_categories")
    for cat in cats if isinstance(cats, list) else []:
        if isinstance(cat, dict) and isinstance(cat.get("tests"), list):
            tests.extend(cat["tests"])
    if isinstance(root.get("tests"), list):
        tests.extend(root["tests"])
    for test in tests:
        if not isinstance(test, dict):
            continue
        name = str(test.get("name") or "unknown")
        entries = test.get("results") if isinstance(test.get("results"), list) else []
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            st = status_of(entry.get("status"))
            if st is None:
                errors.append(f"{name}: unreadable status {entry.get('status')!r}")
                st = "Incomplete"
            for gpu in _gpus_of(entry):
                results.append(DcgmResult(name, st, gpu, _warnings(entry)))
        summary = test.get("test_summary")
        if not entries and isinstance(summary, dict):
            st = status_of(summary.get("status")) or "Incomplete"
            results.append(DcgmResult(name, st, None, _warnings(summary)))
    if not results and not errors:
        errors.append("no test results in the document")
    results = pin_named_gpus(results)
    return DcgmReport(
        kind="diag",
        results=tuple(results),
        overall=overall(results),
        complete=not errors,
        errors=tuple(errors),
        level=level,
    )


# --- health ----------------------------------------------------------------------------------
def parse_health(data: str | bytes) -> DcgmReport:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    doc = _json_doc(text)
    if isinstance(doc, dict):
        return _health_json(doc)
    return _health_table(text)


def _health_json(doc: dict[str, Any]) -> DcgmReport:
    body = doc.get("body", doc)
    results: list[DcgmResult] = []
    overall: str | None = None
    if not isinstance(body, dict):
        return DcgmReport(kind="health", complete=False, errors=("no body in the document",))
    for key, node in body.items():
        value = node.get("value") if isinstance(node, dict) else node
        if key.strip().lower() == "overall health":
            overall = status_of(value)
            continue
        g = _GPU_ONE.search(key)
        if not g:
            continue
        gpu = int(g.group(1))
        children = node.get("children") if isinstance(node, dict) else None
        added = False
        for system, child in (children or {}).items() if isinstance(children, dict) else ():
            st = status_of(child.get("value") if isinstance(child, dict) else child)
            if st is None:
                continue
            results.append(DcgmResult(_system(system), st, gpu, _messages(child)))
            added = True
        if not added:
            results.append(DcgmResult("gpu", status_of(value) or "Incomplete", gpu))
    return _health_report(results, overall)


def _messages(node: Any) -> str:
    """Every text leaf under a health node that is not itself a status word."""
    out: list[str] = []

    def walk(n: Any) -> None:
        if isinstance(n, dict):
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)
        elif isinstance(n, str) and n.strip() and status_of(n) is None:
            out.append(n.strip())

    walk(node)
    return "; ".join(out)[:500]


def _system(name: str) -> str:
    return name.strip().lower().replace(" system", "").replace(" ", "_") or "gpu"


# dcgmi 4.x prints a tree: "GPU", then "-> <id>", "-> Errors", "-> <name> system" (rows of
# NVIDIA/DCGM dcgmi/Health.cpp), with the message on the blank-named rows below.
_TREE_ENTITY = re.compile(r"->\s*(\d+)$")
_TREE_SYSTEM = re.compile(r"->\s*(.+?\s+system)$", re.I)


def _health_table(text: str) -> DcgmReport:
    results: list[DcgmResult] = []
    overall: str | None = None
    gpu: int | None = None
    in_gpus = False  # inside the tree's "GPU" group (not NvSwitch, CPU, ...)
    for line in text.splitlines():
        row = _ROW.match(line.strip())
        if not row:
            continue
        name, value = row.group(1), row.group(2)
        if name.lower() == "overall health":
            overall = status_of(value)
            continue
        if name and not name.startswith("->"):
            in_gpus = name.upper() == "GPU"
        tree = _TREE_ENTITY.match(name) if in_gpus else None
        if tree or (in_gpus and _TREE_SYSTEM.match(name)):
            if tree:
                gpu = int(tree.group(1))
            st = status_of(value)
            system = _TREE_SYSTEM.match(name)
            if system and gpu is not None:
                results = [r for r in results if not (r.gpu == gpu and r.test == "gpu")]
                results.append(DcgmResult(_system(system.group(1)), st or "Incomplete", gpu))
            elif st and st != "Pass":
                results.append(DcgmResult("gpu", st, gpu))
            continue
        if in_gpus and gpu is not None and not name and value and results:
            attach(results, results[-1].test, gpu, value)
            continue
        g = _GPU_ONE.match(name)
        if g:
            gpu = int(g.group(1))
            if status_of(value) and status_of(value) != "Pass":
                results.append(DcgmResult("gpu", status_of(value) or "Incomplete", gpu))
            continue
        sys_row = re.match(r"([A-Za-z][\w ]*?)\s*:\s*(\w+)\s*$", value)
        if gpu is not None and sys_row and status_of(sys_row.group(2)):
            results = [r for r in results if not (r.gpu == gpu and r.test == "gpu")]
            st = status_of(sys_row.group(2)) or "Incomplete"
            results.append(DcgmResult(_system(sys_row.group(1)), st, gpu))
        elif gpu is not None and value.startswith("-") and results:
            attach(results, results[-1].test, gpu, value.lstrip("- "))
    return _health_report(results, overall)


def _health_report(results: list[DcgmResult], overall: str | None) -> DcgmReport:
    errors = [] if overall is not None else ["no Overall Health in the output"]
    return DcgmReport(
        kind="health",
        results=tuple(results),
        overall=overall,
        complete=not errors,
        errors=tuple(errors),
    )
