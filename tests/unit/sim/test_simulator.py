"""The fleet simulator: determinism, scenario ordering, the breaker storm, the fault model."""

from __future__ import annotations

import pytest

from gpuvigil.sim import faults
from gpuvigil.sim.faults import FaultModel, Storm
from gpuvigil.sim.results import Results
from gpuvigil.sim.run import simulate


@pytest.fixture(scope="module")
def small_runs():
    """The default fleet (1,024 nodes x 30 days) and seed, as docs/simulator.md reports it."""
    return {s: simulate(s, seed=1) for s in ("baseline", "node", "platform", "full")}


def test_same_seed_same_numbers():
    a = simulate("full", nodes=96, days=10, seed=7)
    b = simulate("full", nodes=96, days=10, seed=7)
    ja, jb = a.to_json(), b.to_json()
    ja.pop("wall_s"), jb.pop("wall_s")
    assert ja == jb
    c = simulate("full", nodes=96, days=10, seed=8)
    assert c.to_json()["faults"] != ja["faults"] or c.job_interruptions != a.job_interruptions


def test_scenarios_share_faults_and_jobs(small_runs):
    # common random numbers: every scenario of one seed sees the same hardware faults
    counts = {s: r.faults for s, r in small_runs.items()}
    assert max(counts.values()) - min(counts.values()) <= 0.1 * max(counts.values())


def test_each_layer_helps_availability_and_job_success(small_runs):
    order = ["baseline", "node", "platform", "full"]
    avail = [small_runs[s].node_availability for s in order]
    jobs = [small_runs[s].job_success_rate for s in order]
    assert avail == sorted(avail), avail
    assert jobs == sorted(jobs), jobs
    assert small_runs["full"].node_availability > 0.9995
    assert small_runs["full"].job_success_rate > 0.995
    assert small_runs["baseline"].mttd_s > 10 * small_runs["platform"].mttd_s


def test_results_are_fractions_and_layer4_scores_the_events(small_runs):
    for r in small_runs.values():
        for key in ("node_availability", "job_success_rate", "goodput"):
            assert 0.0 <= getattr(r, key) <= 1.0
        assert r.slo["events"] > 0
        assert 0.0 <= r.slo["node_availability"] <= 1.0
        # observe's job counts come from the same job.end events as the engine's
        assert r.slo["job_success_rate"] == pytest.approx(r.job_success_rate)
    # the controller's own events reach layer 4 in the platform scenarios
    assert sum(small_runs["platform"].attribution.values()) > 0


def _storm_pair(kind: str) -> tuple[Results, Results, Results]:
    name = {"tool": "storm", "driver": "driver-storm"}[kind]
    storm = Storm(at_s=3 * 86400.0, fraction=0.25, fixed_after_s=6 * 3600.0, kind=kind)
    kw = {"nodes": 128, "days": 6, "seed": 3, "storm": storm}
    on = simulate(f"{name}+breaker", **kw)  # type: ignore[arg-type]
    off = simulate(f"{name}-no-breaker", **kw)  # type: ignore[arg-type]
    calm = simulate("full", nodes=128, days=6, seed=3)
    return on, off, calm


def test_tool_storm_breaker_keeps_the_fleet_in_service():
    """A dropped binary on 32 of 128 nodes: with the breaker it is the tool's fault and the
    fleet stays as available as without any storm; without it, 32 nodes are blocked."""
    on, off, calm = _storm_pair("tool")
    assert on.breaker_trips >= 1 and off.breaker_trips == 0
    assert on.node_availability > off.node_availability
    assert on.node_availability >= calm.node_availability - 0.0005
    assert on.false_cordons <= 2 and on.false_drains == 0  # the two before it tripped
    assert off.false_cordons + off.false_drains >= 0.2 * 128


def test_driver_storm_breaker_holds_the_burst_for_the_whole_storm():
    """A bad driver makes healthy GPUs read lost on 32 of 128 nodes, with a 10% budget (13
    nodes at a time) so the budget is not what limits: without the breaker the controller
    resets, reboots and replaces them (the new machines boot the same image) until the
    rollback; with it, the repairs wait and the nodes come back when the rollback lands."""
    on, off, calm = _storm_pair("driver")
    assert on.breaker_trips >= 1 and off.breaker_trips == 0
    assert on.remediations == calm.remediations  # nothing admitted: it trips first
    assert (on.false_drains, on.healthy_replaced) == (0, 0)
    assert off.false_drains >= 0.2 * 128 and off.healthy_replaced > 0
    assert on.node_availability > off.node_availability
    assert on.job_interruptions <= off.job_interruptions


def test_fault_model_rates_follow_the_llama3_table():
    by = {k.name: k for k in faults.DEFAULT_KINDS}
    total = sum(k.per_node_day for k in faults.DEFAULT_KINDS if k.calibrated)
    # 419 interruptions / (2,048 nodes x 54 days)
    assert total == pytest.approx(419 / (2048 * 54), rel=1e-9)
    assert by["hbm_ecc"].per_node_day / total == pytest.approx(0.172)
    gpu = sum(k.per_node_day for k in faults.DEFAULT_KINDS if k.calibrated and k.cause == "gpu")
    assert gpu / total == pytest.approx(0.587)


def test_sampling_is_poisson_and_seeded():
    model = FaultModel()
    a = model.sample(1, nodes=1000, horizon_s=30 * 86400.0)
    b = model.sample(1, nodes=1000, horizon_s=30 * 86400.0)
    assert [(t, k.name, n) for t, k, n in a] == [(t, k.name, n) for t, k, n in b]
    expected = sum(k.per_node_day for k in model.kinds) * 1000 * 30
    assert abs(len(a) - expected) < 4 * expected**0.5
    assert [t for t, _, _ in a] == sorted(t for t, _, _ in a)


def test_each_kind_has_its_own_stream():
    """Adding a kind (or dropping one) leaves every other kind's onsets as they were."""
    model = FaultModel()
    fewer = FaultModel(kinds=tuple(k for k in model.kinds if k.name != "hbm_ecc"))
    a = model.sample(3, nodes=500, horizon_s=20 * 86400.0)
    b = fewer.sample(3, nodes=500, horizon_s=20 * 86400.0)
    assert [e for e in a if e[1].name != "hbm_ecc"] == b
    assert len(b) < len(a)


def test_storms_are_deterministic():
    for kind in ("tool", "driver"):
        storm = Storm(at_s=2 * 86400.0, fraction=0.25, fixed_after_s=6 * 3600.0, kind=kind)
        kw = {"nodes": 64, "days": 4, "seed": 5, "storm": storm}
        a, b = (simulate("driver-storm+breaker", **kw).to_json() for _ in range(2))  # type: ignore[arg-type]
        a.pop("wall_s"), b.pop("wall_s")
        assert a == b


@pytest.mark.parametrize("label", ["gpuvigil.io/pool", "example.com/gpu-pool"])
def test_the_fleet_names_its_pools_with_the_configured_label(label: str) -> None:
    """The simulated fleet labels its pools with the controller's `safety.pool_label`, so
    the real controller's budgets count three pools of 64, whatever the label is called."""
    from collections import Counter

    from gpuvigil.platform.controller import ControllerConfig
    from gpuvigil.platform.safety import SafetyConfig, pool_of
    from gpuvigil.sim.engine import Engine
    from gpuvigil.sim.jobs import WORKLOADS
    from gpuvigil.sim.scenarios import SCENARIOS

    cfg = ControllerConfig(safety=SafetyConfig(pool_label=label))
    eng = Engine(scenario=SCENARIOS["full"], nodes=192, days=1, seed=1,
                 workload=WORKLOADS["mixed"], controller=cfg)  # fmt: skip
    assert eng.platform is not None
    assert eng.platform.limits() == {"pool-0": 2, "pool-1": 2, "pool-2": 2}
    eng.platform.silence(eng.platform.machines)  # puts every node on the cluster, listed
    pools = Counter(pool_of(v, cfg.safety) for v in eng.platform.cluster.list_nodes())
    assert pools == {"pool-0": 64, "pool-1": 64, "pool-2": 64}
