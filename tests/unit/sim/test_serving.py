"""Serving pools and per-GPU isolation in the simulator (issue #23): the real controller's
GPU ladder and capacity gate over the simulated cluster, against `platform` without them."""

from __future__ import annotations

import pytest

from gpuvigil.sim.run import simulate
from gpuvigil.sim.scenarios import SCENARIOS

RUN = {"nodes": 512, "days": 30}


@pytest.fixture(scope="module")
def pair():
    return {s: simulate(s, seed=1, **RUN) for s in ("platform", "full")}  # type: ignore[arg-type]


def test_platform_runs_without_the_guards_and_full_with_them() -> None:
    assert not SCENARIOS["platform"].gpu_isolation and not SCENARIOS["platform"].capacity_gate
    assert SCENARIOS["full"].gpu_isolation and SCENARIOS["full"].capacity_gate


def test_full_beats_platform_on_gpu_hours_kept_and_serving_minutes(pair) -> None:
    platform, full = pair["platform"], pair["full"]
    # the whole-node ladder keeps nothing; the GPU's ladder keeps a machine's other GPUs
    assert platform.gpu_hours_kept_by_isolation == 0
    assert full.gpu_hours_kept_by_isolation > 0
    # faults cost both runs minutes (a replica on a broken GPU serves nothing until it is
    # moved and loaded again); drains of healthy replicas cost only `platform`
    assert 0 < full.serving_minutes_below_demand < platform.serving_minutes_below_demand
    assert full.node_availability >= platform.node_availability


def test_without_a_serving_share_nothing_serves() -> None:
    r = simulate("full", nodes=96, days=5, seed=1, workload="llama3")
    assert r.serving_minutes_below_demand == 0 and r.gpu_hours_kept_by_isolation == 0
