"""What `gpuvigil simulate` and `gpuvigil demo` run and print (commands/ call this)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuvigil.node.config import NodeConfig
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.sim.detect import Layer1
from gpuvigil.sim.faults import LLAMA3_INTERRUPTIONS
from gpuvigil.sim.jobs import WORKLOADS
from gpuvigil.sim.record import Recorder
from gpuvigil.sim.results import Results, table
from gpuvigil.sim.run import simulate, storm_controller
from gpuvigil.sim.scenarios import LAYERS, SCENARIOS

__all__ = ["UsageError", "print_results", "run_all", "storm_controller"]


class UsageError(ValueError):
    """A bad option value; the command prints it and exits 2."""


def run_all(
    *,
    scenario: str = "all",
    nodes: int | None = None,
    days: float | None = None,
    seed: int = 1,
    workload: str = "mixed",
    storm: bool = True,
    policy: ControllerConfig | None = None,
    node_config: NodeConfig | None = None,
    progress: Callable[[str, float], None] | None = None,
    recorders: dict[str, Recorder] | None = None,
) -> dict[str, Results]:
    """Every requested run, keyed by name: the registry's scenarios in order (the fleet
    events only with `storm` and the mixed workload), then `<scenario>+policy`."""
    if scenario != "all" and scenario not in SCENARIOS:
        names = ", ".join([*SCENARIOS, "all"])
        raise UsageError(f"unknown scenario {scenario!r} ({names})")
    if workload not in WORKLOADS:
        raise UsageError(f"unknown workload {workload!r} ({', '.join(WORKLOADS)})")
    if nodes is not None and nodes < 1:
        raise UsageError("--nodes must be at least 1")
    if days is not None and days <= 0:
        raise UsageError("--days must be positive")
    events = storm and workload == "mixed"
    names = [n for n in SCENARIOS if n in LAYERS or events] if scenario == "all" else [scenario]
    kw = {"nodes": nodes, "days": days, "seed": seed, "workload": workload}
    runs: list[tuple[str, dict[str, object]]] = [(n, {"scenario": n}) for n in names]
    if policy is not None or node_config is not None:  # the user's policy next to the default
        user = {"controller": policy, "layer1": Layer1(node_config) if node_config else None}
        runs += [(f"{n}+policy", {"scenario": n, **user}) for n in names
                 if n in LAYERS and SCENARIOS[n].layer1]  # fmt: skip
    out: dict[str, Results] = {}
    for name, extra in runs:
        cb = None if progress is None else (lambda f, name=name: progress(name, f))
        rec = (recorders or {}).get(name)
        res = simulate(**kw, **extra, progress=cb, recorder=rec)  # type: ignore[arg-type]
        res.scenario = name
        out[name] = res
    return out


def print_results(results: dict[str, Results], *, out: Any = None) -> None:
    """The runs' table and the notes below it, from the runs' figures (`Results.figures`):
    the same labels, units and numbers as `--json` and the demo's HTML report."""
    from gpuvigil.observe import terminal

    console = out or terminal.console()
    first = next(iter(results.values()))
    title = (
        f"{first.nodes:,} nodes x {first.days:g} days, workload {first.workload}, seed {first.seed}"
    )
    console.print(table(results, width=console.width, title=title))
    if any("storm" in name for name in results):
        console.print(
            "storm pairs: disruption budget 10% of the pool (not the default 2 nodes), so the "
            "breaker, not the budget, is what limits"
        )
    console.print(table(results, width=console.width, which=2))
    if first.workload == "llama3":
        for name, r in results.items():
            console.print(
                f"{name}: {r.calibrated_interruptions:,} unexpected interruptions of the kinds "
                f"the Llama 3 paper lists (it reports {LLAMA3_INTERRUPTIONS}); "
                f"{r.job_interruptions:,} restarts in all"
            )
    console.print(
        "Ground truth of the simulated fleet. Every figure of every run: --json (layer 4's "
        "figures from each run's events under 'slo'); the demo's HTML report shows both."
    )
