"""Parser for `dcgmi diag -r N`, JSON (`-j`) and text tables (`probes.dcgm_table`); the
status words and JSON framing `dcgmi health -c` shares (`probes.dcgm_health_parse`).

Layouts handled: diag JSON of DCGM 3.x (`"DCGM GPU Diagnostic"`, results keyed `gpu_id` or
`gpu_ids`, warnings as strings) and 4.x (`"DCGM Diagnostic"`, results keyed
`entity_group`/`entity_id`, warnings as objects, `test_summary`, `runtime_error`); diag
tables of 2.x-4.x (`probes.dcgm_table`).

Never raises: what cannot be read makes the report incomplete (`complete=False`), which
the rules turn into "could not tell" (CHECK_ERROR) beside every verdict that was read;
never a pass. A deployment verdict whose message names one GPU is pinned to it. Called
by `probes.dcgm` and `gpuvigil analyze`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gpuvigil.node.checks.dcgm.dcgm_table import overall, parse_table, pin_named_gpus
from gpuvigil.node.checks.dcgm.readings import DcgmReport, DcgmResult

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


def status_of(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    return _STATUS.get(text.strip().lower())


def json_doc(text: str) -> Any:
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
    doc = json_doc(text)
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
