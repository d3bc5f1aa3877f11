"""docs/simulator.md's "What the simulator assumes": every assumption that names a gpuvigil
behaviour names the code behind it, that code exists, and the simulator calls it. An
assumption that names no behaviour of gpuvigil's is the world's (and cites no code)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs/simulator.md"
SIM = ROOT / "src/gpuvigil/sim"


def rows() -> list[tuple[str, str, str, str]]:
    text = DOC.read_text()
    section = text.split("## What the simulator assumes", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            out.append((cells[0], cells[1], cells[2], cells[3]))
    return out


def used_by_the_simulator() -> set[str]:
    """`module:name` for every name the simulator's modules import or define."""
    out: set[str] = set()
    for path in SIM.rglob("*.py"):
        module = "gpuvigil.sim." + path.stem if path.stem != "__init__" else "gpuvigil.sim"
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    out.add(f"{node.module}:{alias.name}")
                    out.add(f"{node.module}.{alias.name}:*")  # `from pkg import module`
            elif isinstance(node, ast.FunctionDef | ast.ClassDef):
                out.add(f"{module}:{node.name}")
        # attribute uses of imported modules: `restart.exit_code`, `exit_codes.HANG`
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                out.add(f"*{node.value.id}:{node.attr}")
    return out


def called(ref: str, used: set[str]) -> bool:
    module, name = ref.split(":")
    short = module.rsplit(".", 1)[-1]
    return ref in used or f"{module}:*" in used or f"*{short}:{name}" in used


def test_the_table_is_there() -> None:
    assert len(rows()) >= 8


@pytest.mark.parametrize("row", rows(), ids=lambda r: f"row{r[0]}")
def test_each_assumption_names_its_code_or_none(row: tuple[str, str, str, str]) -> None:
    number, _assumption, behaviour, code = row
    refs = re.findall(r"`(gpuvigil(?:\.\w+)+:\w+)`", code)
    if behaviour.lower().startswith("none"):
        assert code == "-" and not refs, f"row {number}: the world's assumption cites code"
        return
    assert refs, f"row {number} names a gpuvigil behaviour ({behaviour!r}) with no code behind it"
    used = used_by_the_simulator()
    for ref in refs:
        module, name = ref.split(":")
        assert hasattr(importlib.import_module(module), name), f"row {number}: no {ref}"
    assert any(called(ref, used) for ref in refs), (
        f"row {number}: the simulator calls none of {refs}: it restates the behaviour"
    )


def test_layer3_claims_of_the_full_scenario_have_rows() -> None:
    """The scenario table's `full` row claims only behaviours the assumptions table backs."""
    text = DOC.read_text()
    full = next(line for line in text.splitlines() if line.startswith("| `full` |"))
    backed = " ".join(r[2] for r in rows() if not r[2].lower().startswith("none"))
    for claim in ("watchdog", "restart", "drain", "podFailurePolicy"):
        if claim in full:
            assert claim.split()[0] in backed, f"`full` claims {claim!r}; no row backs it"


@pytest.mark.xfail(strict=True, reason="issue #22 item 6 is not done: the simulator's cures "
                   "still come from its own FaultKind.fix table, not the Xid catalog and the "
                   "agent's clearing rules (Xid 119: the catalog asks RESET_GPU, the "
                   "simulator's first cure is REBOOT)")  # fmt: skip
def test_the_first_cure_of_each_xid_is_the_step_the_catalog_asks() -> None:
    """Behaviour, not names: for every fault the agent reports as an Xid, the simulator's
    first ladder step that can cure it is the step the shipped catalog's finding asks."""
    from gpuvigil.core.findings import Action
    from gpuvigil.sim.detect import Layer1
    from gpuvigil.sim.faults import DEFAULT_KINDS

    layer1, wrong = Layer1(), {}
    for kind in DEFAULT_KINDS:
        v = layer1.verdict(kind.fault, gpu=0)
        xid = kind.fix and any(f.code.startswith("XID_") for f in v.findings)
        if xid and Action(kind.fix[0][0]) is not v.action:
            wrong[kind.name] = (v.action.value, kind.fix[0][0])
    assert not wrong, wrong
