"""Properties of the whole loop (policy + safety + controller) on the in-memory cluster.

Hypothesis draws a fleet, faults (fatal or not, fixed by a reset, a reboot, a replacement
or nothing; INVESTIGATE; a check that cannot run), humans' cordons, API errors and the
moments the controller is killed and restarted. Checked on every pass: the disruption
budget is never exceeded, a node that never had a fault is never drained or repaired, a
human's cordon is never lifted, a cordoned node is left alone and the breaker never holds
back a recovery. At the end: every node is HEALTHY or QUARANTINED (or blocked and waiting
while the breaker holds a fleet event), and a run with restarts and API errors ends exactly
like a calm run with no step repeated. (When the breaker trips, what was admitted before
the trip depends on timing an API error shifts; then both runs must only end well.)
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers import CANNOT_RUN, FATAL, INVESTIGATE, NONFATAL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import Action
from gpuvigil.platform.clusters.base import Conflict, Unavailable
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig, pool_limit
from gpuvigil.platform.state import State

TICK_S = 60
TICKS = 140
CFG = ControllerConfig(
    policy=PolicyConfig(suspect_grace_s=300, suspect_max_s=3600, cooldown_s=300),
    safety=SafetyConfig(max_disrupted=1, max_disrupted_percent=50, breaker_close_after_s=300),
)
FIXES = [Action.RESET_GPU, Action.REBOOT, Action.REPLACE, None]


@dataclass(frozen=True)
class NodePlan:
    fault: str  # none | fatal | nonfatal | investigate | cannot_run
    fixed_by: Action | None
    at_tick: int
    cordoned: bool
    pods: int
    protected: int


node_plans = st.builds(
    NodePlan,
    fault=st.sampled_from(["none", "none", "fatal", "nonfatal", "investigate", "cannot_run"]),
    fixed_by=st.sampled_from(FIXES),
    at_tick=st.integers(0, 5),
    cordoned=st.booleans(),
    pods=st.integers(0, 2),
    protected=st.integers(0, 1),
)


@dataclass
class Outcome:
    states: dict[str, State]
    steps: dict[str, int]
    breaker_holds: bool = False
    breaker_tripped: bool = False


def run(
    plans: list[NodePlan], *, restarts: set[int], errors: list[tuple[int, str, str]]
) -> Outcome:
    c = MemoryCluster()
    faulty: set[str] = set()
    cordoned: set[str] = set()
    for i, p in enumerate(plans):
        c.add_node(f"n{i}", pool=f"pool{i % 2}", pods=p.pods, protected_pods=p.protected)
        if p.cordoned:
            c.cordon(f"n{i}")
            cordoned.add(f"n{i}")
    sizes = {f"pool{k}": sum(1 for i in range(len(plans)) if i % 2 == k) for k in (0, 1)}
    ctl = Controller(c, config=CFG, clock=c.clock.now)
    trips = 0
    finding = {
        "fatal": FATAL,
        "nonfatal": NONFATAL,
        "investigate": INVESTIGATE,
        "cannot_run": CANNOT_RUN,
    }
    for tick in range(TICKS):
        for i, p in enumerate(plans):
            if p.fault != "none" and p.at_tick == tick:
                c.set_findings(f"n{i}", [finding[p.fault]], fixed_by=p.fixed_by)
                faulty.add(f"n{i}")
        for at, op, kind in errors:
            if at == tick:
                c.fail_next(op, Conflict if kind == "conflict" else Unavailable)
        if tick in restarts:
            trips += ctl.breaker.status.trips
            ctl = Controller(c, config=CFG, clock=c.clock.now)  # killed; memory lost
        result = ctl.reconcile()
        # Invariants on every pass. The breaker never holds a recovery back: a node whose
        # problem is gone leaves SUSPECT in the pass that sees it (open breaker or not).
        for name, d in result.decisions.items():
            if name not in result.errors and not c.nodes[name].faults and name not in cordoned:
                assert d.state is not State.SUSPECT, (name, d.reason)
        in_use = {pool: 0 for pool in sizes}
        for name, node in c.nodes.items():
            view = c._view(node)
            if view.record is not None and view.record.in_budget:
                in_use[node.pool] += 1
            if name not in faulty:
                assert not [a for a in node.actions if a[0] in ("drain", "request")], name
            if name in cordoned:
                assert "cordon" in node.other_blocks
                assert not node.actions, f"{name} was cordoned by a human: left alone"
        for pool, used in in_use.items():
            assert used <= pool_limit(pool, sizes[pool], CFG.safety), (pool, used)
        c.advance(TICK_S)
    trips += ctl.breaker.status.trips
    states = {}
    steps = {}
    for name, node in c.nodes.items():
        rec = c._view(node).record
        states[name] = rec.state if rec else State.HEALTHY
        steps[name] = len([a for a in node.actions if a[0] == "request"])
    steps["replaced"] = len(c.replaced)
    return Outcome(states, steps, ctl.breaker.status.open, trips > 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plans=st.lists(node_plans, min_size=2, max_size=8).filter(
        lambda ps: sum(p.fault == "cannot_run" for p in ps) < 5
    ),
    restarts=st.sets(st.integers(0, TICKS - 1), max_size=6),
    errors=st.lists(
        st.tuples(
            st.integers(0, TICKS - 1),
            st.sampled_from(["list", "store", "block", "drain", "request", "*"]),
            st.sampled_from(["conflict", "unavailable"]),
        ),
        max_size=6,
    ),
)
def test_every_path_ends_well_and_restarts_converge(plans, restarts, errors) -> None:  # type: ignore[no-untyped-def]
    calm = run(plans, restarts=set(), errors=[])
    rough = run(plans, restarts=restarts, errors=errors)
    for out in (calm, rough):
        # A node ends in service or with a person, or waits, blocked, while the breaker (a
        # fleet event, alerting) holds its repair or its next step.
        held = {State.SUSPECT, State.REMEDIATING, State.VALIDATING} if out.breaker_holds else set()
        ends = {State.HEALTHY, State.QUARANTINED} | held
        assert set(out.states.values()) <= ends, out.states
    if not (calm.breaker_tripped or rough.breaker_tripped):
        assert rough.states == calm.states
        assert rough.steps == calm.steps  # no step lost, none repeated
