"""What `gpuvigil simulate` and `gpuvigil demo` run and print (commands/ call this)."""

from __future__ import annotations

from collections.abc import Callable

from gpuvigil.node.config import NodeConfig
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.safety import SafetyConfig as SafetySettings
from gpuvigil.sim.detect import Layer1
from gpuvigil.sim.faults import Storm
from gpuvigil.sim.jobs import WORKLOADS
from gpuvigil.sim.record import Recorder
from gpuvigil.sim.results import Results, fmt_duration, table
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
        if "storm" in name:
            console.print(
                f"{name}: availability {r.node_availability:.3%}, breaker trips "
                f"{r.breaker_trips}, remediations {r.remediations}, false drains "
                f"{r.false_drains}, restarts {r.job_interruptions}"
            )
    first_full = results.get("full")
    if first_full is not None:
        console.print(
            f"full: {first_full.faults} faults, MTTD {fmt_duration(first_full.mttd_s)}, "
            f"{first_full.remediations} remediations, {first_full.events:,} events "
            f"in {first_full.wall_s:.1f} s"
        )
