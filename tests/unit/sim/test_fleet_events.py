"""The fleet going wrong, against the real controller: a silence, a bad driver, a per-pool
rollout (issue #12's "Done when", at its own size, and the same events without the
safeguard, smaller, to show each test can fail).

`gpuvigil simulate --nodes 512 --days 30 --seed 1 --json`:
- `silence` quarantines no healthy node, availability within 0.05 points of `full`;
- `driver-storm+breaker` drains no healthy node, availability within 0.1 points of `full`;
- `pool-rollout` trips the breaker and replaces no healthy machine.
"""

from __future__ import annotations

import pytest

from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.sim.record import EventRecorder
from gpuvigil.sim.results import Results
from gpuvigil.sim.run import simulate
from gpuvigil.sim.scenarios import SimConfig

DONE_WHEN = ("full", "silence", "driver-storm+breaker", "pool-rollout")


@pytest.fixture(scope="module")
def done_when() -> dict[str, Results]:
    """The issue's runs at its size (about 2 s of CPU each)."""
    return {s: simulate(s, nodes=512, days=30, seed=1, events=False) for s in DONE_WHEN}


def test_silence_quarantines_no_healthy_node(done_when: dict[str, Results]) -> None:
    r, full = done_when["silence"], done_when["full"]
    assert r.breaker_trips >= 8  # every pool's stale cause (8 pools of 64)
    assert r.false_quarantines == 0 and r.false_cordons == 0 and r.false_drains == 0
    assert abs(r.node_availability - full.node_availability) <= 0.0005


def test_driver_storm_with_the_breaker_drains_no_healthy_node(
    done_when: dict[str, Results],
) -> None:
    r, full = done_when["driver-storm+breaker"], done_when["full"]
    assert r.breaker_trips >= 1
    assert r.false_drains == 0 and r.healthy_replaced == 0
    # The held nodes stay blocked while the bad driver is on (the breaker holds repairs,
    # never a fatal finding's block): about 0.2% of node-time, never a drain.
    assert abs(r.node_availability - full.node_availability) <= 0.003


def test_pool_rollout_trips_and_replaces_no_healthy_machine(
    done_when: dict[str, Results],
) -> None:
    r = done_when["pool-rollout"]
    assert r.breaker_trips >= 1 and r.healthy_replaced == 0 and r.false_drains == 0


def _breaker_events(rec: EventRecorder) -> list[dict]:  # type: ignore[type-arg]
    return [e.data for e in rec.events if e.kind == "breaker"]


def test_the_issues_rollout_names_the_driver() -> None:
    """The issue's numbers: a bad driver on 75 of one 100-node pool in a 1,000-node fleet
    (7.5%: the old breaker's 10% share never tripped and 52 healthy machines were replaced
    within 8 h). The breaker trips on the third node and its event names the driver."""
    rec = EventRecorder()
    r = simulate("pool-rollout", nodes=1000, days=1.5, seed=2, recorder=rec,
                 config=SimConfig(pool_nodes=100))  # fmt: skip
    opened = [e for e in _breaker_events(rec) if e["state"] == "open"]
    assert opened and all(e["change"] == "driver-version=560.35.03" for e in opened)
    assert opened[0]["population"] == 75
    assert (r.false_drains, r.healthy_replaced) == (0, 0)


def test_without_the_breaker_the_same_rollout_replaces_healthy_machines() -> None:
    r = simulate("driver-storm-no-breaker", nodes=128, days=1.5, seed=2, events=False)
    assert r.false_drains > 20 and r.healthy_replaced > 0


def test_without_the_stale_cause_a_silence_blocks_every_node() -> None:
    """The control run: with the stale cause switched off, each silent node is blocked
    (fail closed: a lone stale node is), so two hours of silence cost the fleet; never a
    drain or a quarantine, since staleness alone never disrupts."""
    off = ControllerConfig(safety=SafetyConfig(breaker_stale_min_nodes=10**9))
    kw = {"nodes": 64, "days": 2, "seed": 4, "events": False}
    with_cause = simulate("silence", **kw)  # type: ignore[arg-type]
    without = simulate("silence", controller=off, **kw)  # type: ignore[arg-type]
    assert with_cause.false_cordons == 0 and without.false_cordons >= 60
    assert without.false_drains == without.false_quarantines == 0
    assert without.node_availability < with_cause.node_availability - 0.001
