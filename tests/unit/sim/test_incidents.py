"""Issue #22's new scenarios, each against its "Done when" at the issue's size
(`gpuvigil simulate --nodes 512 --days 30 --seed 1 --json --scenario S`).

`broken_in_service_h` is judged as what the incident adds to `full` of the same seed:
`full` itself carries 1.2 node-h at seed 1, nearly all silent data corruption that no
passive check sees until the daily active check, which no controller can shorten.
A test marked xfail(strict) fails today only for a controller behaviour issue #22 asks of
the controller (items 1-5), named in its reason; strict, so it shows when that lands.
"""

from __future__ import annotations

import pytest

from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.policy.values import PolicyConfig
from gpuvigil.sim.results import Results
from gpuvigil.sim.run import simulate

RUNS = ("full", "rack-fault", "switch-fault", "slow-rollout", "staggered-new-xid", "flapping",
        "clock-skew", "fault-while-held")  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict[str, Results]:
    """About 3 s of CPU each."""
    return {s: simulate(s, nodes=512, days=30, seed=1, events=False) for s in RUNS}


def added_exposure_h(runs: dict[str, Results], name: str) -> float:
    return runs[name].broken_in_service_h - runs["full"].broken_in_service_h


def test_a_rack_fault_blocks_every_node(runs: dict[str, Results]) -> None:
    assert runs["rack-fault"].faults > runs["full"].faults  # the incident's faults struck
    assert added_exposure_h(runs, "rack-fault") <= 1.0
    assert runs["rack-fault"].false_quarantines == 0


def test_a_switch_fault_blocks_every_node(runs: dict[str, Results]) -> None:
    assert runs["switch-fault"].faults > runs["full"].faults
    assert added_exposure_h(runs, "switch-fault") <= 1.0
    assert runs["switch-fault"].false_quarantines == 0


def test_a_real_fault_under_an_open_signature_is_blocked(runs: dict[str, Results]) -> None:
    r = runs["fault-while-held"]
    assert r.breaker_trips >= 1
    assert added_exposure_h(runs, "fault-while-held") <= 1.0
    assert r.false_quarantines == 0


def test_a_staggered_new_xid_quarantines_nothing(runs: dict[str, Results]) -> None:
    r = runs["staggered-new-xid"]
    assert added_exposure_h(runs, "staggered-new-xid") <= 1.0
    assert r.false_quarantines == 0


def test_a_slow_rollout_replaces_and_drains_no_healthy_machine(
    runs: dict[str, Results],
) -> None:
    r = runs["slow-rollout"]
    assert r.healthy_replaced == 0 and r.false_drains == 0


def test_a_flapping_machine_goes_back_into_service_at_most_three_times(
    runs: dict[str, Results],
) -> None:
    assert runs["flapping"].max_flaps_in_service <= 3
    assert runs["flapping"].healthy_replaced == 0  # between flaps it is the faulty machine


def test_without_machine_memory_the_machine_flaps() -> None:
    """The control run: with the controller's flap count and lemon episodes out of reach,
    the same machine goes back into service again and again (so the test above can fail)."""
    policy = PolicyConfig(flap_count=10**6, lemon_episodes=10**6)
    r = simulate("flapping", nodes=64, days=3, seed=1, events=False,
                 controller=ControllerConfig(policy=policy))  # fmt: skip
    assert r.max_flaps_in_service >= 10


def test_agents_six_seconds_ahead_leave_a_real_fault_blocked(runs: dict[str, Results]) -> None:
    assert added_exposure_h(runs, "clock-skew") <= 1.0
    assert runs["clock-skew"].false_quarantines == 0
