"""What `gpuvigil simulate` and `gpuvigil demo` run and print (commands/ call this)."""

from __future__ import annotations

from collections.abc import Callable

from gpuvigil.node.config import NodeConfig
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.sim.detect import Layer1
from gpuvigil.sim.jobs import WORKLOADS
from gpuvigil.sim.record import Recorder
from gpuvigil.sim.results import Results, fmt_duration, table
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


def print_results(results: dict[str, Results]) -> None:
    from rich.console import Console

    console = Console(width=None if Console().is_terminal else 110)
    first = next(iter(results.values()))
    title = (
        f"{first.nodes:,} nodes x {first.days:g} days, workload {first.workload}, seed {first.seed}"
    )
    console.print(table(results, title=title))
    if any("storm" in name for name in results):
        console.print(
            "storm pairs: disruption budget 10% of the pool (not the default 2 nodes), so the "
            "breaker, not the budget, is what limits"
        )
    for name, r in results.items():
        sc = SCENARIOS.get(name)
        if sc is not None and sc.fleet_event:
            console.print(
                f"{name}: availability {r.node_availability:.3%}, breaker trips "
                f"{r.breaker_trips}, remediations {r.remediations}, healthy machines "
                f"cordoned {r.false_cordons} / drained {r.false_drains} / quarantined "
                f"{r.false_quarantines} / replaced {r.healthy_replaced}, restarts "
                f"{r.job_interruptions}"
            )
    first_full = results.get("full")
    if first_full is not None:
        console.print(
            f"full: {first_full.faults} faults, MTTD {fmt_duration(first_full.mttd_s)}, "
            f"{first_full.remediations} remediations, {first_full.events:,} events "
            f"in {first_full.wall_s:.1f} s"
        )
