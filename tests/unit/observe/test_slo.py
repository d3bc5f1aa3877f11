"""SLOs from hand-built event streams: each definition in docs/observability.md, by example."""

from __future__ import annotations

import pytest

from gpuvigil.observe import slo
from gpuvigil.observe.stats import budget_burn

from .conftest import make_event as E


def _states(*rows: tuple[float, str, str]) -> list:
    return [E(ts, "node.state", node=n, to=to) for ts, n, to in rows]


def test_availability_is_in_service_node_time_over_node_time() -> None:
    evs = _states(
        (0, "n1", "HEALTHY"), (0, "n2", "HEALTHY"), (100, "n2", "DRAINING"), (200, "n2", "HEALTHY")
    )
    r = slo.compute(evs, start=0, end=1000)
    assert r.node_seconds == 2000 and r.in_service_seconds == 1900
    assert r.availability == pytest.approx(0.95)
    assert r.node_downtime_s == {"n2": 100}


@pytest.mark.parametrize(
    "maintenance",
    [
        [
            E(100, "node.maintenance", node="n2", phase="start"),
            E(300, "node.maintenance", node="n2", phase="end"),
        ],
        _states((100, "n2", "MAINTENANCE"), (300, "n2", "HEALTHY")),
    ],
    ids=["maintenance-events", "maintenance-state"],
)
def test_planned_maintenance_is_excluded_from_both_sides(maintenance: list) -> None:
    evs = sorted(
        _states((0, "n1", "HEALTHY"), (0, "n2", "HEALTHY")) + maintenance, key=lambda e: e.ts
    )
    # A site whose own tooling writes a maintenance state names it (the controller has none).
    config = slo.SloConfig(maintenance_states=frozenset({"MAINTENANCE"}))
    r = slo.compute(evs, start=0, end=1000, config=config)
    assert r.maintenance_seconds == 200
    assert r.availability == 1.0
    assert r.drains == 0  # going to maintenance is not a drain


def test_drain_inside_planned_maintenance_is_not_an_outage() -> None:
    evs = [
        *_states((0, "n1", "HEALTHY")),
        E(10, "node.maintenance", node="n1", phase="start"),
        *_states((20, "n1", "DRAINING"), (90, "n1", "HEALTHY")),
        E(100, "node.maintenance", node="n1", phase="end"),
    ]
    r = slo.compute(evs, start=0, end=200)
    assert r.availability == 1.0 and r.drains == 0


def test_state_before_the_window_carries_in_and_events_after_are_ignored() -> None:
    evs = _states((0, "n1", "DRAINING"), (2000, "n1", "HEALTHY"))
    r = slo.compute(evs, start=1000, end=1500)
    assert (r.node_seconds, r.in_service_seconds) == (500, 0)
    assert r.drains == 0


def test_node_counts_from_its_first_state_and_stops_when_removed() -> None:
    evs = _states((0, "n1", "HEALTHY"), (500, "n2", "HEALTHY"), (600, "n1", "REMOVED"))
    r = slo.compute(evs, start=0, end=1000)
    assert r.node_seconds == 600 + 500


def test_in_service_flag_overrides_the_state_name() -> None:
    evs = [E(0, "node.state", node="n1", to="HEALTHY", in_service=False)]
    assert slo.compute(evs, start=0, end=10).availability == 0.0


def test_mttd_from_evidence_ts_or_simulated_fault() -> None:
    evs = [
        E(100, "fault", node="n1", fault="xid79", component="gpu:0"),
        E(130, "finding.set", node="n1", code="XID_79", component="gpu:0", status="FAILED"),
        E(200, "finding.set", node="n2", code="XID_48", component="gpu:1", evidence_ts=195.0),
        E(300, "finding.set", node="n3", code="XID_48", component="gpu:1"),  # no evidence time
        E(400, "finding.set", node="n3", code="THERMAL_SLOWDOWN", status="WARNING"),
    ]
    r = slo.compute(evs, start=0, end=1000)
    assert r.mttd.count == 2 and sorted(r.mttd.samples) == [5.0, 30.0]


def _drain_episode(*middle) -> list:
    return [
        *_states((0, "n1", "HEALTHY")),
        E(100, "finding.set", node="n1", code="XID_79", component="gpu:3"),
        *_states((110, "n1", "DRAINING")),
        *middle,
        *_states((400, "n1", "HEALTHY")),
    ]


@pytest.mark.parametrize(
    ("middle", "false_positive"),
    [
        ([], True),
        ([E(200, "remediation", node="n1", action="REBOOT", result="succeeded")], False),
        ([E(200, "remediation", node="n1", action="RESET_GPU", result="succeeded")], False),
        (
            [E(200, "remediation", node="n1", action="REBOOT", result="succeeded", found=False)],
            True,
        ),
        ([E(200, "remediation", node="n1", action="REBOOT", result="failed")], True),
        ([E(200, "remediation", node="n1", action="REBOOT", result="started")], True),
        ([E(200, "remediation", node="n1", action="NONE", result="succeeded")], True),
        (
            [
                E(200, "node.maintenance", node="n1", phase="start"),
                E(300, "node.maintenance", node="n1", phase="end"),
            ],
            False,
        ),
    ],
    ids=[
        "nothing-done",
        "reboot",
        "reset",
        "found-nothing",
        "failed",
        "started-only",
        "no-action",
        "taken-to-maintenance",
    ],
)
def test_mttr_and_false_positive_drains(middle: list, false_positive: bool) -> None:
    r = slo.compute(_drain_episode(*middle), start=0, end=1000)
    assert r.drains == 1
    assert r.mttr.samples == [300.0]  # condition set (100) -> back in service (400)
    assert r.false_positive_drains == int(false_positive)


def test_condition_cleared_without_leaving_service_is_absorbed() -> None:
    evs = [
        *_states((0, "n1", "HEALTHY")),
        E(10, "finding.set", node="n1", code="NVLINK_ERRORS", component="gpu:0"),
        E(20, "finding.cleared", node="n1", code="NVLINK_ERRORS", component="gpu:0"),
    ]
    r = slo.compute(evs, start=0, end=100)
    assert (r.incidents_absorbed, r.drains, r.mttr.count) == (1, 0, 0)


def test_cordon_without_a_finding_measures_mttr_from_leaving_service() -> None:
    evs = _states((0, "n1", "HEALTHY"), (50, "n1", "SUSPECT"), (80, "n1", "HEALTHY"))
    r = slo.compute(evs, start=0, end=100)
    assert r.mttr.samples == [30.0]
    assert (r.cordons, r.drains, r.false_positive_drains) == (1, 0, 0)


def test_real_controller_path_is_a_repaired_drain() -> None:
    evs = [
        *_states(
            (0, "n1", "HEALTHY"),
            (10, "n1", "SUSPECT"),
            (20, "n1", "DRAINING"),
            (30, "n1", "REMEDIATING"),
        ),
        E(30, "remediation", node="n1", action="RESET_GPU", result="started"),
        E(90, "remediation", node="n1", action="RESET_GPU", result="succeeded"),
        *_states((90, "n1", "VALIDATING"), (100, "n1", "HEALTHY")),
    ]
    r = slo.compute(evs, start=0, end=200)
    assert (r.drains, r.false_positive_drains, r.cordons) == (1, 0, 0)
    assert r.mttr.samples == [90.0]


def test_dry_run_transitions_are_ignored() -> None:
    evs = [
        *_states((0, "n1", "HEALTHY")),
        E(10, "node.state", node="n1", to="DRAINING", dry_run=True),
    ]
    assert slo.compute(evs, start=0, end=100).availability == 1.0


def test_job_success_and_goodput() -> None:
    evs = [
        E(0, "job.start", job="a", gpus=8, nodes=["n1"]),
        E(0, "job.start", job="b", gpus=4, nodes=["n2"]),
        E(0, "job.start", job="c", gpus=4),
        E(50, "job.restart", job="b", lost_s=10.0, node="n2"),
        E(
            100,
            "job.end",
            job="a",
            result="succeeded",
            productive_gpu_s=700.0,
            allocated_gpu_s=800.0,
        ),
        E(100, "job.end", job="b", result="failed", exit_code=1),  # it gave up: all lost
        E(100, "job.end", job="c", result="cancelled"),  # goodput from lost_s
    ]
    r = slo.compute(evs, start=0, end=1000)
    assert (r.jobs_succeeded, r.jobs_failed, r.jobs_cancelled, r.job_restarts) == (1, 1, 1, 1)
    assert r.job_success_rate == 0.5
    assert r.job_success_by_work == pytest.approx(800 / (800 + 400))  # by GPU-time
    # a: 700/800; b: 400 allocated, nothing productive (abandoned); c: 400, all productive.
    assert r.allocated_gpu_s == 1600 and r.productive_gpu_s == 700 + 0 + 400


@pytest.mark.parametrize(
    ("last", "counts", "rate"),
    [
        (("succeeded", 0), (1, 0, 0), 1.0),
        # The drain is no verdict either way: the failure that ends the job still counts.
        (("failed", 1), (0, 1, 0), 0.0),
    ],
    ids=["then-succeeds", "then-fails"],
)
@pytest.mark.parametrize(
    "drain_end",
    [
        [],  # the launcher was killed before it wrote anything
        [E(40, "job.end", job="d", result="interrupted", exit_code=89)],  # today's launcher
        [E(40, "job.end", job="d", result="failed", exit_code=89)],  # an older launcher's
    ],
    ids=["no-end-event", "interrupted", "failed-89"],
)
def test_a_drained_and_resumed_job_is_one_job_judged_by_its_last_attempt(
    drain_end: list, last: tuple[str, int], counts: tuple[int, int, int], rate: float
) -> None:
    evs = [
        E(0, "job.start", job="d", gpus=2),
        *drain_end,
        E(60, "job.restart", job="d", cause="drain", lost_s=0.0),
        E(100, "job.end", job="d", result=last[0], exit_code=last[1]),
    ]
    r = slo.compute(evs, start=0, end=1000)
    assert (r.jobs_succeeded, r.jobs_failed, r.jobs_censored) == counts
    assert r.job_restarts == 1 and r.job_success_rate == rate and r.allocated_gpu_s == 200


def test_a_drained_job_that_never_resumes_is_censored_not_failed() -> None:
    evs = [
        E(0, "job.start", job="d", gpus=2),
        E(40, "job.end", job="d", result="interrupted", exit_code=89),
    ]
    r = slo.compute(evs, start=0, end=100)
    assert (r.jobs_succeeded, r.jobs_failed, r.jobs_censored) == (0, 0, 1)


def test_a_restored_breaker_cause_is_not_a_new_trip() -> None:
    evs = [
        E(1, "breaker", state="open", causes=["gpu/GPU_LOST@fleet"]),
        E(2, "breaker", state="open", causes=["gpu/GPU_LOST@fleet"], restored=True),
    ]
    assert slo.compute(evs, start=0, end=10).breaker_trips == 1


def test_no_ended_job_is_no_verdict_and_running_jobs_are_censored() -> None:
    """A run whose one job never ends (Llama 3 pre-training) has no job success, not 100%;
    the job is censored, and its time so far still counts for goodput."""
    evs = [
        E(0, "job.start", job="big", gpus=16),
        E(500, "job.restart", job="big", lost_s=100.0),
        E(560, "job.start", job="big", gpus=16),  # the next attempt: the same job goes on
    ]
    r = slo.compute(evs, start=0, end=1000)
    assert r.job_success_rate is None and r.job_success_by_work is None
    assert r.jobs_censored == 1
    assert r.allocated_gpu_s == 16_000 and r.productive_gpu_s == 16 * 900
    j = r.to_json()["job_success"]
    assert j["achieved"] is None and j["censored"] == 1 and j["by_work"] is None


def test_a_person_releasing_a_quarantine_is_not_a_false_positive() -> None:
    """Quarantined, then released by a person (only `gpuvigil release` leaves QUARANTINED):
    their verdict ends the episode, whatever they found."""
    evs = _states(
        (0, "n1", "HEALTHY"), (10, "n1", "DRAINING"), (20, "n1", "QUARANTINED"),
        (30, "n1", "VALIDATING"), (40, "n1", "HEALTHY"),
        (50, "n2", "HEALTHY"), (60, "n2", "DRAINING"), (70, "n2", "HEALTHY"),
    )  # fmt: skip
    r = slo.compute(evs, start=0, end=100)
    assert (r.drains, r.human_releases, r.false_positive_drains) == (2, 1, 1)


def test_exit_code_decides_the_result_when_result_is_missing() -> None:
    evs = [E(1, "job.end", job="a", exit_code=0), E(2, "job.end", job="b", exit_code=3)]
    r = slo.compute(evs, start=0, end=10)
    assert (r.jobs_succeeded, r.jobs_failed) == (1, 1)


def test_budget_burn_and_json() -> None:
    assert budget_burn(0.999, 0.9995) == pytest.approx(2.0)
    assert budget_burn(1.0, 0.9995) == 0.0
    assert budget_burn(None, 0.9995) is None
    evs = _states((0, "n1", "HEALTHY"), (999, "n1", "DRAINING"))
    out = slo.compute(evs, start=0, end=1000, targets=slo.Targets(availability=0.99)).to_json()
    assert out["availability"]["achieved"] == 0.999
    assert out["availability"]["met"] is True
    assert out["availability"]["budget_burned"] == pytest.approx(0.1)
    assert out["job_success"]["achieved"] is None


def test_window_defaults_to_first_and_last_event() -> None:
    r = slo.compute(_states((10, "n1", "HEALTHY"), (20, "n1", "DRAINING"), (30, "n1", "HEALTHY")))
    assert (r.start, r.end, r.node_seconds, r.in_service_seconds) == (10, 30, 20, 10)


def test_breaker_trips_counted() -> None:
    evs = [
        E(1, "breaker", state="open"),
        E(2, "breaker", state="closed"),
        E(3, "breaker", state="open"),
    ]
    assert slo.compute(evs).breaker_trips == 2


def test_timeline_stays_bounded_over_a_long_log() -> None:
    from gpuvigil.observe import timeline

    tl = timeline.Timeline()
    day = 86400.0
    for d in range(3 * 365):  # three years of hourly buckets would be 26,280
        tl.add(d * day, (d + 1) * day, in_service=d % 2 == 0, maintenance=False)
    assert len(tl.buckets) <= timeline.MAX_BUCKETS
    series = tl.series()
    assert len(series) <= timeline.POINTS
    total = sum(row[0] for row in tl.buckets.values())
    assert total == 3 * 365 * day  # nothing lost when merging
    assert 0.45 < sum(p["availability"] for p in series) / len(series) < 0.55


def test_a_node_first_seen_in_a_transition_was_in_its_from_state_since_the_log_began() -> None:
    evs = [
        E(0, "node.state", node="n0", to="HEALTHY"),
        E(100, "node.state", node="n1", to="DRAINING", **{"from": "HEALTHY"}),
        E(200, "node.state", node="n1", to="HEALTHY", **{"from": "DRAINING"}),
    ]
    r = slo.compute(evs, start=0, end=400)
    assert (r.node_seconds, r.in_service_seconds) == (800, 700)
    assert r.drains == 1 and r.mttr.samples == [100.0]


def test_a_late_event_is_not_counted_twice() -> None:
    evs = _states((0, "n1", "HEALTHY"), (100, "n1", "DRAINING"), (50, "n1", "HEALTHY"))
    r = slo.compute(evs, start=0, end=200)
    assert r.node_seconds == 200  # never more node-time than wall time


def test_ettr_is_productive_step_time_over_wall_time_to_the_end_or_the_horizon() -> None:
    """ETTR counts the whole wall time from a job's start: a drained job off the cluster
    between two attempts loses that time too (its restart's lost_s runs from the checkpoint
    it resumed). A job still running is measured to the window's close."""
    evs = [
        E(0, "job.start", job="a", gpus=2),
        E(40, "job.end", job="a", result="interrupted", exit_code=89),  # drained, off-cluster
        E(60, "job.restart", job="a", lost_s=20.0),  # saved at 40, back at 60
        E(100, "job.end", job="a", result="succeeded"),
        E(0, "job.start", job="b", gpus=1),
        E(50, "job.restart", job="b", lost_s=10.0),
    ]
    r = slo.compute(evs, start=0, end=200)
    # a: 2 x 100 wall, 2 x 20 lost; b: 1 x 200 wall to the horizon, 10 lost.
    assert r.ettr_wall_gpu_s == 200 + 200
    assert r.ettr_productive_gpu_s == 160 + 190
    assert r.ettr == pytest.approx(350 / 400)
    assert r.to_json()["ettr"]["ratio"] == pytest.approx(0.875)


def test_ettr_of_a_job_that_gave_up_is_zero_and_none_without_jobs() -> None:
    evs = [E(0, "job.start", job="a", gpus=4), E(10, "job.end", job="a", result="failed")]
    assert slo.compute(evs, start=0, end=20).ettr == 0.0
    assert slo.compute([], start=0, end=20).ettr is None
