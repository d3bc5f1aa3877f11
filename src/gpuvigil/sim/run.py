"""Run the simulator: one scenario of the registry, or several (CLI, demo, bench, tests)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.sim.detect import Layer1
from gpuvigil.sim.engine import Engine
from gpuvigil.sim.faults import FaultModel, Storm
from gpuvigil.sim.jobs import WORKLOADS, Workload
from gpuvigil.sim.record import EventRecorder, Recorder
from gpuvigil.sim.results import Results
from gpuvigil.sim.scenarios import SCENARIOS, SimConfig

DEFAULT_NODES = 1024
DEFAULT_DAYS = 30.0


def storm_controller() -> ControllerConfig:
    """The storm pairs' controller: a realistic large fleet's budget (10% of the pool, and
    a rate limit that does not bind first), so what differs between the pair is the
    breaker, not the default budget of 2 nodes at a time."""
    safety = SafetyConfig(max_disrupted=10**6, max_disrupted_percent=10.0, max_actions=10**6)
    return ControllerConfig(safety=safety)


def simulate(
    scenario: str = "full",
    *,
    nodes: int | None = None,
    days: float | None = None,
    seed: int = 1,
    workload: str | Workload = "mixed",
    config: SimConfig | None = None,
    model: FaultModel | None = None,
    storm: Storm | None = None,
    breaker: bool = True,
    progress: Callable[[float], None] | None = None,
    recorder: Recorder | None = None,
    events: bool = True,
    controller: ControllerConfig | None = None,
    layer1: Layer1 | None = None,
) -> Results:
    """One run of a registered scenario (its fleet event, if any, placed for `days`);
    `storm` replaces the scenario's own. `events`: record real events and score them with
    layer 4 (observe)."""
    wl = WORKLOADS[workload] if isinstance(workload, str) else workload
    if days is None:
        days = wl.single_job_days or DEFAULT_DAYS
    if nodes is None:
        nodes = wl.nodes or DEFAULT_NODES
    sc = SCENARIOS[scenario]
    if controller is None and sc.wide_budget:
        controller = storm_controller()
    started = time.perf_counter()
    engine = Engine(
        scenario=sc, nodes=nodes, days=days, seed=seed, workload=wl, config=config,
        model=model, storm=storm or sc.storm_for(days), silence=sc.silence_for(days),
        breaker=breaker and sc.breaker, progress=progress,
        recorder=recorder or (EventRecorder() if events else None), controller=controller,
        layer1=layer1,
    )  # fmt: skip
    res = engine.run()
    res.wall_s = time.perf_counter() - started
    return res


def compare(scenarios: list[str] | None = None, **kw: object) -> dict[str, Results]:
    return {name: simulate(name, **kw) for name in scenarios or list(SCENARIOS)}  # type: ignore[arg-type]
