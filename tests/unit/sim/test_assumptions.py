"""docs/simulator.md's "What the simulator assumes": every assumption that names a gpuvigil
behaviour names the code behind it, that code exists, and the simulator calls it. An
assumption that names no behaviour of gpuvigil's is the world's (and cites no code)."""

from __future__ import annotations

import ast
import importlib
import random
import re
from collections import Counter
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


def test_the_first_cure_of_each_xid_is_the_step_the_catalog_asks() -> None:
    """Behaviour, not names: for every fault the agent reports as an Xid, the first step of
    the ladder the simulator cures it with (`Layer1.cures`, what the engine samples) is the
    step the shipped catalog's verdict asks, no weaker step ever cures it, and that step
    cures with the fault model's odds (Xid 119: the catalog asks RESET_GPU; the table's
    first cure was a reboot, so the controller's reset never cured it)."""
    from gpuvigil.core.findings import Action
    from gpuvigil.sim.detect import Layer1, cure_probability, sample_fixed_by
    from gpuvigil.sim.faults import DEFAULT_KINDS

    layer1, wrong, checked = Layer1(), {}, set()
    for kind in DEFAULT_KINDS:
        v = layer1.verdict(kind.fault, gpu=0)
        if not kind.fix or not any(f.code.startswith("XID_") for f in v.findings):
            continue
        checked.add(kind.name)
        cures = layer1.cures(kind, gpu=0)
        draws = [sample_fixed_by(cures, random.Random(f"{kind.name}:{i}")) for i in range(400)]
        least = min((a for a in draws if a is not None), key=lambda a: a.rank)
        weaker = [a for a in Action if a.rank < v.action.rank]
        if cures[0][0] is not v.action or least is not v.action:
            wrong[kind.name] = (v.action.value, cures[0][0].value, least.value)
        assert all(cure_probability(cures, a) == 0.0 for a in weaker), kind.name
        # the odds are the table's: the catalog's step cures with its first chance
        share = sum(a is v.action for a in draws) / len(draws)
        assert abs(share - dict(cures)[v.action]) < 0.08, (kind.name, share)
    assert not wrong, wrong
    assert {"gpu_lost", "hbm_ecc", "sram_ecc", "gsp_error"} <= checked


def test_the_agent_clears_each_xid_at_the_simulators_first_cure() -> None:
    """The Xid finding that asks the verdict's step says the agent clears it on that very
    step (`clears_on`, from kernel_log.rules.xid's clearing): so the step that cures the fault in
    the simulator is the one after which the real agent stops reporting it."""
    from gpuvigil.core.findings import Action
    from gpuvigil.sim.detect import Layer1
    from gpuvigil.sim.faults import DEFAULT_KINDS

    clears = {"window": Action.RESTART_APP, "gpu_reset": Action.RESET_GPU,
              "reboot": Action.REBOOT}  # fmt: skip
    layer1, seen = Layer1(), 0
    for kind in DEFAULT_KINDS:
        v, cures = layer1.verdict(kind.fault, gpu=0), layer1.cures(kind, gpu=0)
        for f in v.findings:
            if f.code.startswith("XID_") and f.action is v.action and cures:
                seen += 1
                assert clears.get(f.evidence["clears_on"]) is cures[0][0], (kind.name, f.code)
    assert seen >= 4  # Xid 79, 95, 119, 13


def test_a_reset_the_catalog_asks_is_what_cures_xid_119() -> None:
    """In `full`, Xid 119 faults are cured by the controller's GPU reset (the catalog's
    step) as often as the fault model says the first remedy works (90%): a reboot follows
    only the resets that failed. Measured (64 nodes, 10 days, 25 faults): 24 resets, 5
    reboots, 0 replacements; with the table's first step (reboot 90%) every reset failed:
    24 resets, 24 reboots, 5 replacements."""
    from gpuvigil.sim.faults import DEFAULT_KINDS, FaultModel
    from gpuvigil.sim.record import EventRecorder
    from gpuvigil.sim.run import simulate

    gsp = next(k for k in DEFAULT_KINDS if k.name == "gsp_error")
    rec = EventRecorder()
    res = simulate("full", nodes=64, days=10, seed=1, model=FaultModel(kinds=(gsp,), scale=300),
                   recorder=rec)  # fmt: skip
    steps = Counter(
        e.data.get("action")
        for e in rec.events
        if e.kind == "remediation" and e.data.get("result") == "started"
    )
    assert res.faults >= 20 and steps["RESET_GPU"] >= 20
    assert steps["REBOOT"] <= steps["RESET_GPU"] / 3, steps
    assert steps["REPLACE"] <= 2, steps
