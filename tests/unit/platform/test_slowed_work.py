"""Work on a quarantined node whose finding slows it (a throttled GPU) moves off when an
idle node of its pool can take it (`PolicyConfig.slowing_codes`, `Fleet.room`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import INVESTIGATE, T0, finding, view
from pydantic import ValidationError

from gpuvigil.core.findings import Action
from gpuvigil.platform.policy import Fleet, OpKind, PolicyConfig, decide
from gpuvigil.platform.safety import Gate, SafetyConfig
from gpuvigil.platform.state import Record, State

S = timedelta(seconds=1)
CFG = PolicyConfig()
HOT = finding("THERMAL_SLOWDOWN", action=Action.INVESTIGATE, component="gpu:5", check="gpu")
ROOM = Fleet(room=True)


def quarantined(*findings, running: int = 1, **kw):  # type: ignore[no-untyped-def]
    r = Record(state=State.QUARANTINED, since=T0 - 300 * S, reason="needs a human: x", **kw)
    return view(*findings, record=r, running=running)


def kinds(d) -> list[OpKind]:  # type: ignore[no-untyped-def]
    return [op.kind for op in d.ops]


def test_a_slowed_node_s_work_moves_off_and_the_node_stays_quarantined() -> None:
    d = decide(quarantined(HOT), fleet=ROOM, now=T0, config=CFG)
    assert d.state is State.QUARANTINED
    assert kinds(d) == [OpKind.DRAIN] and d.disruptive and d.store
    assert d.record.last_action_at == T0  # counts against the rate, once
    assert d.record.reason == "needs a human: x"  # the quarantine's own reason is kept
    assert "THERMAL_SLOWDOWN gpu:5" in d.reason


def test_the_move_goes_on_without_taking_the_budget_again() -> None:
    first = decide(quarantined(HOT), fleet=ROOM, now=T0, config=CFG)
    node = view(HOT, record=first.record, running=1, at=T0 + 30 * S)
    again = decide(node, fleet=Fleet(room=False, may_disrupt=False), now=T0 + 30 * S,
                   config=CFG)  # fmt: skip
    assert kinds(again) == [OpKind.DRAIN] and not again.disruptive and not again.store
    assert again.ops[0].deadline == first.ops[0].deadline  # the same operation


@pytest.mark.parametrize(
    ("node", "fleet", "held"),
    [
        (quarantined(HOT), Fleet(room=False), "no idle node in pool"),
        (quarantined(HOT), Fleet(room=True, may_disrupt=False, why_not="budget"), "budget"),
        (quarantined(HOT, last_action_at=T0 - 400 * S), ROOM, "cooldown"),
    ],
    ids=["no room", "budget", "cooldown"],
)
def test_the_move_waits_for_room_and_safety(node, fleet, held) -> None:  # type: ignore[no-untyped-def]
    d = decide(node, fleet=fleet, now=T0, config=CFG)
    assert d.state is State.QUARANTINED and not d.ops and not d.disruptive
    assert held in d.held


@pytest.mark.parametrize(
    ("node", "config"),
    [
        (quarantined(INVESTIGATE), CFG),  # needs a human, but does not slow the work
        (quarantined(HOT, running=0), CFG),  # nothing left to move
        (quarantined(HOT), PolicyConfig(slowing_codes=[])),  # switched off
        (quarantined(), CFG),  # the slowdown cleared while quarantined
    ],
    ids=["not slowing", "no work", "off", "cleared"],
)
def test_nothing_moves_without_slowed_work(node, config) -> None:  # type: ignore[no-untyped-def]
    d = decide(node, fleet=ROOM, now=T0, config=config)
    assert d.state is State.QUARANTINED and not d.ops and not d.disruptive and not d.held


def test_an_unreadable_summary_never_moves_work() -> None:
    node = quarantined(HOT)
    stale = view(HOT, record=node.record, running=1, at=T0 - 3600 * S)
    d = decide(stale, fleet=ROOM, now=T0, config=CFG)
    assert not d.ops and not d.disruptive


def test_the_whole_path_from_a_throttled_gpu() -> None:
    """SUSPECT (blocked, needs a human) -> QUARANTINED after fatal_grace_s -> work moved."""
    node = view(HOT, running=1)
    d1 = decide(node, fleet=ROOM, now=T0, config=CFG)
    assert d1.state is State.SUSPECT and kinds(d1) == [OpKind.BLOCK]
    later = T0 + 121 * S
    d2 = decide(view(HOT, record=d1.record, running=1, at=later), fleet=ROOM, now=later,
                config=CFG)  # fmt: skip
    assert d2.state is State.QUARANTINED and not d2.disruptive
    d3 = decide(view(HOT, record=d2.record, running=1, at=later), fleet=ROOM, now=later,
                config=CFG)  # fmt: skip
    assert d3.state is State.QUARANTINED and kinds(d3) == [OpKind.DRAIN] and d3.disruptive


def test_an_unknown_slowing_code_is_a_config_error_that_names_it() -> None:
    with pytest.raises(ValidationError, match="THERMAL_SLOWDWN"):
        PolicyConfig(slowing_codes=["THERMAL_SLOWDWN"])


def test_the_gate_counts_idle_fit_nodes_of_the_pool_as_room() -> None:
    idle = view(name="idle", pool="a")
    busy = view(name="busy", pool="a", running=1)
    blocked = view(name="blocked", pool="b", blocked_by_others=("cordon",))
    stale = view(name="stale", pool="b", at=T0 - 3600 * S)
    uncounted = view(name="uncounted", pool="b", running_known=False)  # k8s: pods not listed
    slowed = quarantined(HOT)
    nodes = [idle, busy, blocked, stale, uncounted, slowed]
    gate = Gate(SafetyConfig(pool_label="pool"), nodes, now=T0)
    assert gate.fleet_for(view(name="x", pool="a")).room
    assert not gate.fleet_for(view(name="x", pool="b")).room
    gate.consume(busy)  # a drain's work takes the one idle node
    assert not gate.fleet_for(view(name="x", pool="a")).room


def _throttled_fleet(idle: bool):  # type: ignore[no-untyped-def]
    from gpuvigil.platform.clusters.memory import MemoryCluster

    c = MemoryCluster()
    c.add_node("hot", pods=1)
    c.add_node("busy", pods=1)
    if idle:
        c.add_node("idle")
    c.set_findings("hot", [HOT], fixed_by=None)
    return c


@pytest.mark.parametrize("idle", [True, False], ids=["idle node", "no idle node"])
def test_the_controller_moves_a_throttled_node_s_pod_only_with_room(tmp_path, idle) -> None:  # type: ignore[no-untyped-def]
    """The real controller over the in-memory cluster: blocked at once, quarantined after
    `fatal_grace_s`, then its pod evicted (while an idle node stands by); the node stays
    quarantined for its person, and the move is a remediation event and metric."""
    import json

    from prometheus_client import CollectorRegistry

    from gpuvigil.core.events import EventWriter
    from gpuvigil.platform import metrics as pmetrics
    from gpuvigil.platform.controller import Controller

    c = _throttled_fleet(idle)
    reg = CollectorRegistry()
    ctl = Controller(c, clock=c.clock.now, events=EventWriter(tmp_path / "ev.jsonl"),
                     metrics=pmetrics.build(reg))  # fmt: skip
    states = []
    for _ in range(8):  # 30 s passes: past the 120 s grace, then one more
        states.append(ctl.reconcile().decisions["hot"].state)
        c.advance(30)
    assert states[0] is State.SUSPECT and states[-1] is State.QUARANTINED
    assert len(c.nodes["busy"].pods) == 1  # nobody else's work moves
    lines = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    moves = [e for e in lines if e["kind"] == "remediation" and e["data"]["action"] == "DRAIN"]
    drained = reg.get_sample_value("gpuvigil_remediations_total",
                                   {"action": "DRAIN", "result": "started"}) or 0  # fmt: skip
    if idle:
        assert not c.nodes["hot"].pods and len(moves) == drained == 1
        assert "moving its work off" in moves[0]["data"]["reason"]
    else:
        assert len(c.nodes["hot"].pods) == 1 and not moves and drained == 0
