"""What `gpuvigil simulate` and `gpuvigil demo` run and print (commands/ call this)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuvigil.node.config import NodeConfig
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.safety import SafetyConfig as SafetySettings
from gpuvigil.sim.detect import Layer1
from gpuvigil.sim.faults import LLAMA3_INTERRUPTIONS, Storm
from gpuvigil.sim.jobs import WORKLOADS
from gpuvigil.sim.record import Recorder
from gpuvigil.sim.results import Results, table
from gpuvigil.sim.run import simulate
from gpuvigil.sim.scenarios import SCENARIOS


class UsageError(ValueError):
    """A bad option value; the command prints it and exits 2."""


def storm_controller() -> ControllerConfig:
    """The storm pairs' controller: a realistic large fleet's budget (10% of the pool, and
    a rate limit that does not bind first), so what differs between the pair is the
    breaker, not the default budget of 2 nodes at a time."""
    safety = SafetySettings(max_disrupted=10**6, max_disrupted_percent=10.0, max_actions=10**6)
    return ControllerConfig(safety=safety)


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
    """Every requested run, keyed by name: the scenarios, then the storm pair."""
    if scenario != "all" and scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario {scenario!r} (baseline, node, platform, full, all)")
    if workload not in WORKLOADS:
        raise UsageError(f"unknown workload {workload!r} ({', '.join(WORKLOADS)})")
    if nodes is not None and nodes < 1:
        raise UsageError("--nodes must be at least 1")
    if days is not None and days <= 0:
        raise UsageError("--days must be positive")
    names = list(SCENARIOS) if scenario == "all" else [scenario]
    kw = {"nodes": nodes, "days": days, "seed": seed, "workload": workload}
    runs: list[tuple[str, dict[str, object]]] = [(n, {"scenario": n}) for n in names]
    if policy is not None or node_config is not None:  # the user's policy next to the default
        user = {"controller": policy, "layer1": Layer1(node_config) if node_config else None}
        runs += [(f"{n}+policy", {"scenario": n, **user}) for n in names
                 if SCENARIOS[n].layer1]  # fmt: skip
    if storm and scenario == "all" and workload == "mixed":
        at = min(10.0, (days or 30.0) / 3) * 86400.0
        budget = {"controller": storm_controller()}
        for prefix, kind in (("storm", "tool"), ("driver-storm", "driver")):
            s = Storm(at_s=at, kind=kind)
            runs += [
                (f"{prefix}+breaker", {"scenario": "full", "storm": s, "breaker": True, **budget}),
                (f"{prefix}-no-breaker",
                 {"scenario": "full", "storm": s, "breaker": False, **budget}),
            ]  # fmt: skip
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
