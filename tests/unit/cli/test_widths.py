"""Every command that prints a table, rendered at 80 and at 200 columns: no line wider than
the terminal, and not one token cut, shortened or lost (the words at 80 columns are the
words at 200; only the layout differs: wrapped cells, tables split into parts).

A table rich lays out by itself (the old way) fails this test: it folds `0000:3b:00.0`
across lines and writes `driver-storm-no-breaker` as `drive…` (see
test_the_check_catches_a_cut_token).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from gpuvigil import cli
from gpuvigil.commands import nodes
from gpuvigil.observe import synthetic
from gpuvigil.sim import cli as sim_cli
from gpuvigil.sim.record import EventRecorder

ROOT = Path(__file__).resolve().parents[3]
FAULTY = ROOT / "examples" / "faulty-node"
BOX = re.compile(r"[\u2500-\u257f]")  # box drawing
PART = re.compile(r"^\(\d+/\d+\)$")  # "(1/2)": a table split into parts
# Timings differ from one run to the next: "115 ms", "in 13.8 s"
TIMES = re.compile(r"\b\d[\d,.]*(?= ms\b)|(?<=in )\d+\.\d(?= s\b)")


def words(text: str) -> set[str]:
    return {w for w in BOX.sub(" ", TIMES.sub("#", text)).split() if not PART.match(w)}


def assert_fits(narrow: str, wide: str, *, width: int = 80) -> None:
    too_wide = [ln for ln in narrow.splitlines() if cell_len(ln.rstrip()) > width]
    assert not too_wide, too_wide[:3]
    assert "…" not in narrow, "an ellipsis: something was shortened"
    lost, new = words(wide) - words(narrow), words(narrow) - words(wide)
    assert not lost and not new, f"at {width} columns: {sorted(lost)[:8]} -> {sorted(new)[:8]}"


def run(width: int, *args: str) -> str:
    result = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code in (0, 1, 2), result.output
    assert "Traceback" not in result.output, result.output
    return result.output


def both(*args: str) -> tuple[str, str]:
    return run(80, *args), run(200, *args)


def test_the_check_catches_a_cut_token() -> None:
    def render(width: int) -> str:
        console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        t = Table()
        for h in ("run", "bus id", "message"):
            t.add_column(h, overflow="fold" if h == "bus id" else "ellipsis")
        t.add_row("driver-storm-no-breaker", "0000:3b:00.0", "a long message " * 6)
        console.print(t)
        return console.export_text()

    with pytest.raises(AssertionError):
        assert_fits(render(30), render(200), width=30)


def test_analyze_and_logscan(monkeypatch: pytest.MonkeyPatch) -> None:
    # Paths relative to the checkout: the layout chosen must not depend on where it lies
    # (a deep worktree's absolute paths push the inputs table into blocks).
    monkeypatch.chdir(ROOT)
    faulty = FAULTY.relative_to(ROOT)
    assert_fits(*both("analyze", "--kmsg", str(faulty / "dmesg.txt"),
                      "--nvidia-smi-xml", str(faulty / "nvidia-smi-q-x.xml"),
                      "--dcgm-diag", str(faulty / "dcgmi-diag-r1.json"),
                      "--sysfs", str(faulty / "sysfs.tar.gz"),
                      "--instance-type", "p5.48xlarge"))  # fmt: skip
    narrow, wide = both("logscan", str(faulty / "dmesg.txt"))
    assert_fits(narrow, wide)
    assert "0000:5d:00" in narrow


def test_check() -> None:
    assert_fits(*both("check"))


def test_report(tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    synthetic.write(events, nodes=24, days=7, seed=3)
    narrow, wide = both("report", str(events), "--window", "7d")
    assert_fits(narrow, wide)
    assert "left out" in narrow  # the top-10 tables say how many they leave out


def test_simulate_demo_and_replay(tmp_path: Path) -> None:
    rec = EventRecorder(write_to=tmp_path / "events.jsonl")
    # seed 1: the full run repairs nodes (5 steps), so the replay has decisions to compare
    results = sim_cli.run_all(nodes=64, days=6, seed=1, recorders={"full": rec})
    out = {}
    for width in (80, 200):
        console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        sim_cli.print_results(results, out=console)
        out[width] = console.export_text()
    assert_fits(out[80], out[200])
    for name in results:  # every run's name whole, and distinct
        assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", out[80], re.M), name
    narrow, wide = both("replay", str(tmp_path / "events.jsonl"))
    assert_fits(narrow, wide)
    assert "predicted against the controller's recorded decisions" in narrow


def test_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [
        {"node": f"gpu-node-{i:03d}.cluster.internal", "state": s, "health": "FAILED",
         "blocked_by": ["gpuvigil", "node.kubernetes.io/unschedulable"], "running": True,
         "reason": "validation failed: ECC_UNCORRECTED_VOLATILE gpu:3, ROW_REMAP_PENDING gpu:3 "
                   "after RESET_GPU", "dry_run": i == 0,
         "next": "wait for RESET_GPU (fails at 2026-01-01T00:10:00+00:00)",
         "held": "disruption budget of pool default in use (2/2)", "held_by": "budget",
         "history": [{"at": "2026-01-01T00:00:00+00:00", "to": s, "reason": "persisted: XID_79"}]}
        for i, s in enumerate(("REMEDIATING", "QUARANTINED", "HEALTHY"))
    ]  # fmt: skip
    out = {}
    for width in (80, 200):
        monkeypatch.setenv("COLUMNS", str(width))
        console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
        monkeypatch.setattr("gpuvigil.observe.terminal.console", lambda c=console, **_: c)
        nodes.render(rows, ["2h", "3d", "-"], history=True)
        out[width] = console.export_text()
    assert_fits(out[80], out[200])


@pytest.mark.usefixtures("need_torch")
def test_preflight() -> None:
    args = ("preflight", "--expect-gpus", "0", "--device", "cpu", "--checks", "matmul")
    assert_fits(*both(*args))
