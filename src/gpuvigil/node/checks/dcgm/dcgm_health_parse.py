"""The answer of `dcgmi health -c` (`-j` JSON or the text tree) -> a DcgmReport. Pure.

The layout, as NVIDIA/DCGM `dcgmi/Health.cpp` builds it through `dcgmi/DcgmiOutput.*`:
`Overall Health` (Healthy / Warning / Failure), then one group per entity kind (`GPU`,
`Switch`, `CPU`, `ConnectX`, ...), under it each entity id with its own verdict, under
that `Errors`, and under it one `<name> system` per watch with its verdict and message.
The JSON form nests the same tree: `{"body": {"GPU": {"children": {"0": {"value":
"Warning", "children": {"Errors": {"children": {"Power system": {"value": "Warning",
"overflow": ["Detected ...", ...]}}}}}}}}}`; the text form prints it as rows `GPU`,
`-> 0`, `-> Errors`, `-> Power system`, with the message on blank-named rows below.
Also read: the flat `GPU ID: n` tables of older dcgmi.

A verdict on a GPU is that GPU's; a verdict on any other entity (an NVSwitch, a CPU, a
NIC) is the node's (entity 0 of a switch is not GPU 0). Never raises: without a readable
`Overall Health` the report is incomplete (CHECK_ERROR, "could not tell"), never a pass.

Known limit: one older `Health.cpp` (NVIDIA/DCGM, 2022 copyright) keyed each entity by its
health code (10 Warning, 20 Failure) instead of its id, and dropped the `Errors` of an entity
with one incident. Such a report still fails or warns, but on a GPU number that may not be
there; the text cannot tell it from a real GPU 10 or 20.
"""

from __future__ import annotations

import re
from typing import Any

from gpuvigil.node.checks.dcgm.dcgm_parse import json_doc, status_of
from gpuvigil.node.checks.dcgm.readings import DcgmReport, DcgmResult

_OVERALL = "overall health"
_GPU_KEY = re.compile(r"^\s*GPU(?:\s*ID)?\s*:?\s*(\d+)\s*$", re.I)  # older dcgmi: "GPU ID: 0"
_ROW = re.compile(r"^\s*[|+]\s*(.*?)\s*\|\s*(.*?)\s*[|+]\s*$")
_TREE_ENTITY = re.compile(r"->\s*(\d+)$")
_MAX_INFO = 500


def parse_health(data: str | bytes) -> DcgmReport:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    doc = json_doc(text)
    if isinstance(doc, dict):
        return _from_json(doc)
    return _from_table(text)


# --- JSON (`dcgmi health -c -j`) --------------------------------------------------------------
def _from_json(doc: dict[str, Any]) -> DcgmReport:
    body = doc.get("body", doc)
    if not isinstance(body, dict):
        return DcgmReport(kind="health", complete=False, errors=("no body in the document",))
    results: list[DcgmResult] = []
    overall: Any = None
    for key, node in body.items():
        if key.strip().lower() == _OVERALL:
            overall = _value(node)
            continue
        flat = _GPU_KEY.match(key)
        if flat:
            results.extend(_entity(node, group="GPU", entity=flat.group(1)))
            continue
        children = node.get("children") if isinstance(node, dict) else None
        for entity, child in children.items() if isinstance(children, dict) else ():
            results.extend(_entity(child, group=key, entity=entity))
    return _report(results, overall)


def _value(node: Any) -> Any:
    return node.get("value") if isinstance(node, dict) else node


def _entity(node: Any, *, group: str, entity: str) -> list[DcgmResult]:
    """One entity's verdicts: one per watch system under it, or its own verdict alone."""
    gpu = int(entity) if group.strip().upper() == "GPU" and entity.strip().isdigit() else None
    own = status_of(_value(node)) or "Incomplete"
    if gpu is None:
        return [] if own == "Pass" else [DcgmResult(_other(group, entity), own, None)]
    out = []
    for name, sub in _systems(node):
        st = status_of(_value(sub))
        if st is not None:
            out.append(DcgmResult(_system(name), st, gpu, _messages(sub)))
    return out or [DcgmResult("gpu", own, gpu)]


def _systems(node: Any) -> list[tuple[str, Any]]:
    """The `<name> system` nodes under an entity: under its `Errors` (the tree dcgmi
    prints) or straight under it (the flat older layout)."""
    children = node.get("children") if isinstance(node, dict) else None
    if not isinstance(children, dict):
        return []
    errors = children.get("Errors")
    if isinstance(errors, dict) and isinstance(errors.get("children"), dict):
        return list(errors["children"].items())
    return list(children.items())


def _messages(node: Any) -> str:
    """Every text leaf under a health node that is not itself a status word (the
    message dcgmi cuts into `overflow` pieces, or an older `Error` child)."""
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
    return " ".join(out)[:_MAX_INFO]


def _system(name: str) -> str:
    return name.strip().lower().replace(" system", "").replace(" ", "_") or "gpu"


def _other(group: str, entity: str) -> str:
    """A non-GPU entity's verdict, named for the node: "switch 0", "cpu 1"."""
    return f"{group.strip().lower()} {entity.strip()}"


# --- Text tree (`dcgmi health -c`) ------------------------------------------------------------
def _from_table(text: str) -> DcgmReport:
    results: list[DcgmResult] = []
    overall: Any = None
    group = ""  # the entity kind of the rows below ("GPU", "Switch", ...)
    gpu: int | None = None  # the GPU the rows below belong to, None under other entities
    flat = False  # older dcgmi: "GPU ID: n" rows, "Memory system: Failure" values
    for line in text.splitlines():
        row = _ROW.match(line.strip())
        if not row:
            continue
        name, value = row.group(1), row.group(2)
        key = _GPU_KEY.match(name)
        entity = key or _TREE_ENTITY.match(name)
        system = _FLAT_SYSTEM.match(value) if flat and not name else None
        system = system if system and status_of(system.group(2)) else None
        if name.lower() == _OVERALL:
            overall = value
        elif entity:
            flat = bool(key)
            kind = "GPU" if flat else group
            found = _entity({"value": value}, group=kind, entity=entity.group(1))
            gpu = int(entity.group(1)) if kind.strip().upper() == "GPU" else None
            results.extend(r for r in found if r.result != "Pass")
        elif name and not name.startswith("->"):
            group, gpu, flat = name, None, False
        elif gpu is not None and (system or _tree_system(name)):
            said = system.group(2) if system else value
            title = system.group(1) if system else name.lstrip("-> ")
            results = [r for r in results if not (r.gpu == gpu and r.test == "gpu")]
            results.append(DcgmResult(_system(title), status_of(said) or "Incomplete", gpu))
        elif gpu is not None and not name and value and results and results[-1].gpu == gpu:
            # dcgmi cuts one message into 54-character pieces, one per row: join them back.
            last = results[-1]
            info = f"{last.info} {value.lstrip('- ')}".strip()[:_MAX_INFO]
            results[-1] = DcgmResult(last.test, last.result, last.gpu, info)
    return _report(results, overall)


def _tree_system(name: str) -> bool:
    """A watch row under a GPU in the tree: `-> Memory system`, `-> Driver`, and not the
    `-> Errors` heading above them."""
    return name.startswith("->") and name.lstrip("-> ").lower() not in ("", "errors")


# Older flat tables print a system on the value side: "| | Memory system: Failure |".
_FLAT_SYSTEM = re.compile(r"^([A-Za-z][\w ]*?)\s*:\s*(\w+)\s*$")


def _report(results: list[DcgmResult], said: Any) -> DcgmReport:
    overall = status_of(said)
    if said is None:
        errors = ["no Overall Health in the output"]
    elif overall is None:
        errors = [f"unreadable Overall Health {str(said)[:60]!r}"]
    else:
        errors = []
    return DcgmReport(
        kind="health",
        results=tuple(results),
        overall=overall,
        complete=not errors,
        errors=tuple(errors),
    )
