"""The loop's own duties: dry-run never acts, exclusions, metrics, events, conflicts."""

from __future__ import annotations

import json

import pytest
from helpers import FATAL
from prometheus_client import CollectorRegistry

from gpuvigil.core.events import EventWriter
from gpuvigil.platform import metrics as pmetrics
from gpuvigil.platform.clusters.base import Conflict
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State

AT_ONCE = ControllerConfig(policy=PolicyConfig(fatal_grace_s=0))  # a fatal finding drains now


def fleet(n: int = 4) -> MemoryCluster:
    c = MemoryCluster()
    for i in range(n):
        c.add_node(f"n{i}", pods=1)
    return c


def test_dry_run_decides_and_records_but_never_acts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = fleet()
    c.set_findings("n1", [FATAL])
    events = EventWriter(tmp_path / "ev.jsonl")
    cfg = AT_ONCE.model_copy(update={"dry_run": True})
    ctl = Controller(c, config=cfg, clock=c.clock.now, events=events)
    r = ctl.reconcile()
    assert r.decisions["n1"].state is State.DRAINING
    assert not any(c.calls[op] for op in ("store", "block", "drain", "request", "event"))
    lines = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "node.state" and lines[0]["data"]["dry_run"] is True


def test_excluded_nodes_are_observed_only() -> None:
    c = MemoryCluster()
    c.add_node("n0", labels={"gpuvigil.io/exclude": "true"})
    c.set_findings("n0", [FATAL])
    Controller(c, clock=c.clock.now).reconcile()
    assert not c.nodes["n0"].actions


def test_node_seconds_out_of_service_are_counted_between_passes() -> None:
    """The availability SLI's counter: the nodes out at a pass, for the seconds until the
    next (the controller's clock), whatever the scrape interval; a gap past MAX_GAP_S is
    not counted (a standby's leader counted it)."""
    from gpuvigil.platform.announce import MAX_GAP_S

    c = fleet()
    reg = CollectorRegistry()
    ctl = Controller(c, config=AT_ONCE, clock=c.clock.now, metrics=pmetrics.build(reg))
    total = "gpuvigil_node_unavailable_seconds_total"
    ctl.reconcile()
    assert reg.get_sample_value(total) == 0
    c.set_findings("n1", [FATAL])
    c.advance(10)
    ctl.reconcile()  # n1 goes out now: the 10 s before had every node in service
    assert reg.get_sample_value(total) == 0
    c.advance(20)
    ctl.reconcile()
    assert reg.get_sample_value(total) == 20  # one node out for 20 s
    c.advance(MAX_GAP_S + 1)
    ctl.reconcile()
    assert reg.get_sample_value(total) == 20


def test_metrics_one_series_per_node() -> None:
    c = fleet()
    reg = CollectorRegistry()
    ctl = Controller(c, config=AT_ONCE, clock=c.clock.now, metrics=pmetrics.build(reg))
    ctl.reconcile()
    assert reg.get_sample_value("gpuvigil_nodes", {"state": "HEALTHY"}) == 4
    assert reg.get_sample_value("gpuvigil_nodes_in_service") == 4
    c.set_findings("n1", [FATAL])
    ctl.reconcile()
    assert reg.get_sample_value("gpuvigil_node_state", {"node": "n1", "state": "DRAINING"}) == 1
    assert reg.get_sample_value("gpuvigil_node_state", {"node": "n1", "state": "HEALTHY"}) is None
    assert reg.get_sample_value("gpuvigil_nodes_in_service") == 3
    assert reg.get_sample_value("gpuvigil_disruption_budget_in_use", {"pool": "default"}) == 1
    assert reg.get_sample_value("gpuvigil_disruption_budget_limit", {"pool": "default"}) == 1
    assert (
        reg.get_sample_value(
            "gpuvigil_remediations_total", {"action": "DRAIN", "result": "started"}
        )
        == 1
    )


def test_a_conflict_rereads_and_decides_again() -> None:
    c = fleet()
    c.set_findings("n1", [FATAL])
    reg = CollectorRegistry()
    ctl = Controller(c, config=AT_ONCE, clock=c.clock.now, metrics=pmetrics.build(reg))
    c.fail_next("store", Conflict, node="n1")
    r = ctl.reconcile()
    assert "n1" not in r.errors and r.decisions["n1"].state is State.DRAINING
    assert c.calls["get"] == 1


def test_api_errors_are_counted_and_nothing_is_acted_on() -> None:
    from gpuvigil.platform.clusters.base import Unavailable

    c = fleet()
    reg = CollectorRegistry()
    ctl = Controller(c, clock=c.clock.now, metrics=pmetrics.build(reg))
    c.fail_next("list", Unavailable)
    assert not ctl.reconcile().listed
    assert (
        reg.get_sample_value("gpuvigil_controller_api_errors_total", {"kind": "unavailable"}) == 1
    )


def _storm(c: MemoryCluster, names: list[str], ctl: Controller, minutes: int) -> None:
    from helpers import CANNOT_RUN

    for n in names:
        c.set_findings(n, [CANNOT_RUN], fixed_by=None)
    for _ in range(minutes):
        ctl.reconcile()
        c.advance(60)


def test_a_dropped_binary_fleet_wide_is_held_by_the_breaker_not_blocked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A driver upgrade removes nvidia-smi on 40 of 100 nodes: that check fails closed on
    all of them. That is the tool, not 40 bad machines: the breaker opens (metric, event)
    and holds the blocks; a node with a real fault meanwhile still gets the full ladder
    within budget; when the binary is back the breaker closes with hysteresis."""
    c = fleet(100)
    reg = CollectorRegistry()
    events = EventWriter(tmp_path / "ev.jsonl")
    ctl = Controller(c, clock=c.clock.now, metrics=pmetrics.build(reg), events=events)
    _storm(c, [f"n{i}" for i in range(40)], ctl, 30)
    assert reg.get_sample_value("gpuvigil_circuit_breaker_open") == 1
    assert reg.get_sample_value("gpuvigil_circuit_breaker_trips_total") == 1
    assert all(not c.nodes[f"n{i}"].actions for i in range(40))  # never blocked
    assert reg.get_sample_value("gpuvigil_nodes_in_service") == 100
    assert reg.get_sample_value(
        "gpuvigil_circuit_breaker_signature_nodes",
        {"code": "DEPENDENCY_MISSING", "attribute": "", "value": ""},
    ) == 40  # fmt: skip
    c.set_findings("n50", [FATAL])  # a real fault during the storm: blocked and repaired
    ctl.reconcile()
    c.advance(121)
    ctl.reconcile()
    assert [a[0] for a in c.nodes["n50"].actions][:2] == ["block", "drain"]
    for i in range(40):
        c.clear_findings(f"n{i}")
    for _ in range(20):  # the rollback landed; 900 s later the breaker closes
        ctl.reconcile()
        c.advance(60)
    assert reg.get_sample_value("gpuvigil_circuit_breaker_open") == 0
    lines = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    breaker = [e["data"] for e in lines if e["kind"] == "breaker"]
    assert [b["state"] for b in breaker] == ["open", "closed"]
    assert "nvml/DEPENDENCY_MISSING on 40 of 100 nodes" in breaker[0]["reason"]
    assert breaker[0]["causes"] == ["nvml/DEPENDENCY_MISSING@fleet"]
    assert breaker[0]["code"] == "DEPENDENCY_MISSING" and breaker[0]["nodes"] == 40
    assert breaker[1]["causes"] == ["nvml/DEPENDENCY_MISSING@fleet"]  # what it had held
    assert reg.get_sample_value(
        "gpuvigil_circuit_breaker_signature_nodes",
        {"code": "DEPENDENCY_MISSING", "attribute": "", "value": ""},
    ) is None  # fmt: skip


def test_blocks_set_for_the_broken_check_are_lifted_when_the_breaker_trips() -> None:
    """Two nodes fail closed: not yet a pattern, so they are blocked (fail closed). Eight
    more follow: now it is the tool, and the blocks gpuvigil set for it alone are lifted."""
    c = fleet(100)
    ctl = Controller(c, clock=c.clock.now)
    _storm(c, [f"n{i}" for i in range(2)], ctl, 2)
    assert not ctl.breaker.status.open
    assert all(c.nodes[f"n{i}"].our_taints == {"unhealthy"} for i in range(2))
    _storm(c, [f"n{i}" for i in range(2, 10)], ctl, 2)
    assert ctl.breaker.status.open
    assert all(not c.nodes[f"n{i}"].our_taints for i in range(10))
    assert all(ctl.reconcile().decisions[f"n{i}"].state is State.HEALTHY for i in range(10))


def test_without_holding_blocks_a_dropped_binary_blocks_but_never_drains() -> None:
    """`breaker_hold_blocks: false`: the strict behaviour."""
    from gpuvigil.platform.safety import SafetyConfig

    c = fleet(100)
    reg = CollectorRegistry()
    cfg = ControllerConfig(safety=SafetyConfig(breaker_hold_blocks=False))
    ctl = Controller(c, config=cfg, clock=c.clock.now, metrics=pmetrics.build(reg))
    _storm(c, [f"n{i}" for i in range(40)], ctl, 30)
    assert reg.get_sample_value("gpuvigil_circuit_breaker_open") == 1
    assert all(not [a for a in n.actions if a[0] in ("drain", "request")] for n in c.nodes.values())
    assert reg.get_sample_value("gpuvigil_nodes", {"state": "SUSPECT"}) == 40
    for i in range(40):
        c.clear_findings(f"n{i}")
    ctl.reconcile()
    assert reg.get_sample_value("gpuvigil_nodes", {"state": "HEALTHY"}) == 100
    assert reg.get_sample_value("gpuvigil_nodes_in_service") == 100


def test_an_adapter_reading_another_pool_label_is_refused() -> None:
    """Budgets (safety.pool_label) and the adapter's pools (Kubernetes: the eviction grace)
    must name the same pools: a mismatch is a wiring error, refused at start."""
    custom = ControllerConfig(safety=SafetyConfig(pool_label="example.com/gpu-pool"))
    with pytest.raises(ValueError, match="example.com/gpu-pool"):
        Controller(MemoryCluster(), config=custom)
    Controller(MemoryCluster(pool_label="example.com/gpu-pool"), config=custom)


def test_out_of_service_clock_starts_when_the_node_leaves_service() -> None:
    """gpuvigil_node_out_of_service_since_seconds keeps the moment the node left HEALTHY
    through every later state change; the state's deadline follows the policy's timeout."""
    c = fleet()
    reg = CollectorRegistry()
    ctl = Controller(c, config=AT_ONCE, clock=c.clock.now, metrics=pmetrics.build(reg))
    ctl.reconcile()
    assert (
        reg.get_sample_value("gpuvigil_node_out_of_service_since_seconds", {"node": "n1"}) is None
    )
    c.set_findings("n1", [FATAL])
    left = c.clock.now().timestamp()
    ctl.reconcile()
    v = reg.get_sample_value
    assert v("gpuvigil_node_out_of_service_since_seconds", {"node": "n1"}) == left
    drain_deadline = left + AT_ONCE.policy.drain_timeout_s
    assert (
        v("gpuvigil_node_state_deadline_timestamp_seconds", {"node": "n1", "state": "DRAINING"})
        == drain_deadline
    )
    seen = {State.DRAINING}
    for _ in range(40):  # drain, remediate, fail, escalate...: the clock never restarts
        c.clock.advance(120)
        r = ctl.reconcile()
        state = r.decisions["n1"].state if "n1" in r.decisions else None
        if state is None or state is State.HEALTHY:
            break
        seen.add(state)
        assert v("gpuvigil_node_out_of_service_since_seconds", {"node": "n1"}) == left
    assert len(seen) >= 2, seen  # it did change state while out of service
    assert (
        v("gpuvigil_node_state_deadline_timestamp_seconds", {"node": "n1", "state": "DRAINING"})
        is None
    )


def test_a_stored_record_without_the_field_reads_its_history() -> None:
    from datetime import UTC, datetime, timedelta

    from gpuvigil.platform.state import Record

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    r = Record().moved(State.SUSPECT, at=t0, reason="x")
    r = r.moved(State.DRAINING, at=t0 + timedelta(hours=1), reason="y")
    assert r.left_service == t0 and r.out_of_service_since() == t0
    old = r.model_copy(update={"left_service": None})  # written by an older controller
    assert old.out_of_service_since() == t0
    assert r.moved(State.HEALTHY, at=t0 + timedelta(hours=2), reason="z").left_service is None
