"""`split-brain` and `api-outage`: the simulator attacks the real controller and election
(sim.adversity), and the witnesses it reads can see a broken fence."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.leader import LeaderElector
from gpuvigil.platform.state import Preflight
from gpuvigil.sim.run import simulate

RUN = {"nodes": 256, "days": 20, "seed": 1}


@pytest.fixture(scope="module")
def full() -> object:
    return simulate("full", **RUN)


def test_split_brain_never_two_writers_never_over_budget(full) -> None:  # type: ignore[no-untyped-def]
    r = simulate("split-brain", **RUN)
    a = r.adversity
    assert a["stalls"] > 0 and a["leader_changes"] > 0  # the attack happened
    assert a.get("fenced_writes", 0) > 0  # a stalled leader resumed and was refused
    assert a.get("writes_by_non_holder", 0) == 0
    assert a["most_over_budget"] == 0
    assert a["passes_a"] > 0 and a["passes_b"] > 0  # both led in turn
    # a skewed clock and leader changes cost the fleet nothing
    assert abs(r.node_availability - full.node_availability) < 0.001
    assert r.remediations == full.remediations


def test_the_witness_sees_a_fence_that_lets_everything_through(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(LeaderElector, "fence", lambda self: 15.0)
    a = simulate("split-brain", **RUN).adversity
    assert a.get("writes_by_non_holder", 0) > 0


def test_api_outage_acts_on_nothing_then_recovers(full) -> None:  # type: ignore[no-untyped-def]
    r = simulate("api-outage", **RUN)
    a = r.adversity
    assert a["refused_calls"] > 0 and a["failed_passes"] == a["passes_during_outage"] > 0
    assert a["passes"] > 0  # passes went on after the outage
    assert abs(r.node_availability - full.node_availability) < 0.0005


def test_memory_preflight_keys_on_the_validation_not_on_clocks() -> None:
    """A controller whose clock runs 20 s ahead asks for a run with `since` in the
    cluster's future: one run per validation, finished `preflight_s` later (it used to
    restart at every pass and never finish)."""
    c = MemoryCluster(preflight_s=60)
    c.add_node("n0", unvalidated=True)
    since = c.clock.now() + timedelta(seconds=20)
    from gpuvigil.platform.state import Record, State

    c.store("n0", Record(state=State.VALIDATING, since=since))
    assert c.revalidate("n0", since=since) == 1
    for _ in range(70):
        c.advance(1)
        assert c.revalidate("n0", since=since) == 0
    view = c.get_node("n0")
    assert isinstance(view.preflight, Preflight) and view.preflight.passed
