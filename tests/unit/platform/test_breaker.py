"""The circuit breaker's two causes on the whole loop (table-driven and hypothesis).

One check failing closed on many nodes at once is the tool, not the hardware: the breaker
opens and, with `breaker_hold_blocks_for_tool_breakage` (the default), those findings
alone do not block a node. Everything else stays fail closed: a real hardware finding is
blocked (and repaired within budget), a handful of could-not-run nodes below the threshold
are blocked, and the share cause (a bad driver that looks like hardware) holds repairs
for as long as the fleet still shows it.
"""

from __future__ import annotations

import pytest
from helpers import CANNOT_RUN, FATAL, NONFATAL, T0, finding, view
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.safety import Breaker, Gate, SafetyConfig
from gpuvigil.platform.state import State

TIMEOUT = finding("CHECK_TIMEOUT", check="nvml", component="node")
OTHER_TOOL = finding("DEPENDENCY_MISSING", check="fabric", component="node")


def _run(
    kinds: list[str], *, passes: int = 3, **safety: object
) -> tuple[MemoryCluster, Controller]:
    c = MemoryCluster()
    per = {"cannot_run": [CANNOT_RUN], "fatal": [FATAL], "both": [CANNOT_RUN, FATAL],
           "nonfatal": [NONFATAL], "other_tool": [OTHER_TOOL]}  # fmt: skip
    for i, kind in enumerate(kinds):
        c.add_node(f"n{i}", pods=1)
        if kind in per:
            c.set_findings(f"n{i}", per[kind], fixed_by=None)
    cfg = ControllerConfig(safety=SafetyConfig(max_disrupted=100, **safety))  # type: ignore[arg-type]
    ctl = Controller(c, config=cfg, clock=c.clock.now)
    for _ in range(passes):
        ctl.reconcile()
        c.advance(60)
    return c, ctl


def blocked(c: MemoryCluster, i: int) -> bool:
    return "unhealthy" in c.nodes[f"n{i}"].our_taints


@pytest.mark.parametrize(
    ("kinds", "hold", "want_open", "want_blocked"),
    [
        # 10 nodes lose the tool: held, none blocked; the healthy stay in service
        (["cannot_run"] * 10 + ["none"] * 90, True, True, set()),
        # the same without holding: fail closed everywhere (the strict setting)
        (["cannot_run"] * 10 + ["none"] * 90, False, True, set(range(10))),
        # a handful (below breaker_same_check_nodes): still blocked, breaker closed
        (["cannot_run"] * 4 + ["none"] * 96, True, False, set(range(4))),
        # a real fault during the tool storm is blocked; so is a node with both
        (["cannot_run"] * 8 + ["fatal", "both"] + ["none"] * 90, True, True, {8, 9}),
        # another check failing closed on one node is not explained by the storm
        (["cannot_run"] * 8 + ["other_tool"] + ["none"] * 91, True, True, {8}),
    ],
)
def test_tool_breakage_holds_only_its_own_blocks(kinds, hold, want_open, want_blocked) -> None:  # type: ignore[no-untyped-def]
    c, ctl = _run(kinds, breaker_hold_blocks_for_tool_breakage=hold)
    assert ctl.breaker.status.open is want_open
    assert {i for i in range(len(kinds)) if blocked(c, i)} == want_blocked


def test_a_real_fault_gets_the_ladder_while_the_tool_cause_holds() -> None:
    c, ctl = _run(["cannot_run"] * 10 + ["fatal"] + ["none"] * 89)
    assert ctl.breaker.status.open and not ctl.breaker.status.holds_disruptions
    assert [a[0] for a in c.nodes["n10"].actions][:2] == ["block", "drain"]


def test_share_cause_stays_open_while_the_fleet_still_shows_it() -> None:
    """A bad driver: 25 of 100 nodes read lost GPUs. The breaker holds their repairs for
    as long as they still do (not just one window after the burst), then closes with
    hysteresis once the share is below `breaker_close_percent`."""
    c, ctl = _run(["fatal"] * 25 + ["none"] * 75, passes=120)  # two hours
    assert ctl.breaker.status.holds_disruptions
    assert not any(a[0] in ("drain", "request") for n in c.nodes.values() for a in n.actions)
    assert all(blocked(c, i) for i in range(25))  # fail closed: no new work on them
    for i in range(22):  # the rollback lands on most; 3 (3%) still report it
        c.clear_findings(f"n{i}")
    for _ in range(16):
        ctl.reconcile()
        c.advance(60)
    assert not ctl.breaker.status.open
    assert all(not blocked(c, i) for i in range(22))  # recovered without a person
    assert all(blocked(c, i) for i in range(22, 25))


def test_close_thresholds_give_hysteresis() -> None:
    cfg = SafetyConfig(breaker_same_check_nodes=5, breaker_same_check_close_nodes=3,
                       breaker_close_after_s=0)  # fmt: skip
    b = Breaker(cfg)
    fleet = [view(name=f"h{i}") for i in range(95)]
    assert b.update([view(CANNOT_RUN, name=f"n{i}") for i in range(5)] + fleet, now=T0) == "open"
    assert b.status.checks == {"nvml"}
    four = [view(TIMEOUT, name=f"n{i}") for i in range(3)]  # other code, same check: 3 left
    assert b.update(four + fleet, now=T0) is None and b.status.open
    assert b.update(four[:2] + fleet, now=T0) == "closed"
    assert b.update([view(CANNOT_RUN, name=f"n{i}") for i in range(4)] + fleet, now=T0) is None


def test_gate_passes_tolerated_checks_only_when_configured() -> None:
    nodes = [view(CANNOT_RUN, name=f"n{i}") for i in range(6)]
    for hold, want in ((True, frozenset({"nvml"})), (False, frozenset())):
        cfg = SafetyConfig(breaker_hold_blocks_for_tool_breakage=hold)
        b = Breaker(cfg)
        b.update(nodes, now=T0)
        fleet = Gate(cfg, nodes, now=T0, breaker=b.status).fleet_for(nodes[0])
        assert fleet.tolerated_checks == want and fleet.breaker_open and fleet.may_disrupt


kinds = st.sampled_from(["none", "none", "cannot_run", "fatal", "nonfatal", "both"])


@settings(max_examples=30, deadline=None)
@given(kinds=st.lists(kinds, min_size=5, max_size=40), hold=st.booleans())
def test_breaker_blocks_exactly_what_it_should(kinds, hold) -> None:  # type: ignore[no-untyped-def]
    """Whatever the mix: a node with a real finding is blocked; a healthy node is not; a
    could-not-run-only node is blocked unless the tool cause holds (enough nodes, and
    holding switched on); nothing is ever disrupted for a could-not-run finding alone."""
    c, ctl = _run(kinds, breaker_hold_blocks_for_tool_breakage=hold)
    trip = SafetyConfig().breaker_same_check_nodes
    tool = sum(k in ("cannot_run", "both") for k in kinds) >= trip
    assert ("nvml" in ctl.breaker.status.checks) is tool
    for i, kind in enumerate(kinds):
        if kind == "none":
            assert not blocked(c, i)
        elif kind == "cannot_run":
            assert blocked(c, i) is not (tool and hold)
            assert not [a for a in c.nodes[f"n{i}"].actions if a[0] in ("drain", "request")]
        else:
            rec = ctl.cluster.get_node(f"n{i}").record
            assert rec is not None and rec.state is not State.HEALTHY
            assert blocked(c, i) or rec.state is State.REMEDIATING
