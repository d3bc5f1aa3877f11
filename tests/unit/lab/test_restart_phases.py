"""The phases of a gang restart, measured from the lab's timeline (lab.result.restart_phases):
each the seconds between two events the parts wrote, none guessed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuvigil.lab.follow import Follower
from gpuvigil.lab.result import PHASES, figures, restart_phases


def ev(t: float, event: str, node: str | None = None) -> dict[str, Any]:
    return {"t_s": t, "event": event, "node": node, "detail": ""}


# An xid79 as the lab runs it: the old attempt's own milestones come before the fault and
# must not count; the healthy peer n1's block is not the broken node's.
TIMELINE = [
    ev(-50.0, "job.attempt"),
    ev(-40.0, "first_step", "n1"),
    ev(0.0, "fault", "n2"),
    ev(0.5, "block", "n1"),
    ev(2.0, "block", "n2"),
    ev(3.0, "job.gang_stopped"),
    ev(9.0, "job.attempt"),
    ev(9.5, "job.pod_scheduled", "n1"),
    ev(10.0, "job.pod_scheduled", "n3"),
    ev(14.0, "worker_start", "n1"),
    ev(15.5, "rendezvous", "n1"),
    ev(16.0, "restored", "n1"),
    ev(16.25, "first_step", "n1"),
    ev(40.0, "job.attempt"),  # a second restart later: not this one's phases
    ev(45.0, "first_step", "n1"),
]


def test_each_phase_is_the_time_between_two_events() -> None:
    assert restart_phases(TIMELINE, "n2") == {
        "detect": 2.0,
        "stop": 7.0,
        "reschedule": 1.0,
        "process_start": 4.0,
        "rendezvous": 1.5,
        "restore": 0.5,
        "first_step": 0.25,
    }
    assert tuple(restart_phases(TIMELINE, "n2") or {}) == PHASES
    assert figures(TIMELINE, "n2")["restart_phases"] == restart_phases(TIMELINE, "n2")


def test_a_hang_is_detected_by_training_and_a_missing_event_leaves_two_phases_null() -> None:
    t = [e for e in TIMELINE if e["event"] not in ("block", "rendezvous")]
    t.insert(3, ev(1.25, "hang", "n1"))
    phases = restart_phases(t, "n2")
    assert phases is not None
    assert phases["detect"] == 1.25 and phases["stop"] == 7.75
    # nothing marks the end of the rendezvous: it and the restore after it are unknown
    assert phases["rendezvous"] is None and phases["restore"] is None
    assert phases["first_step"] == 0.25


def test_no_restart_no_phases() -> None:
    assert restart_phases([e for e in TIMELINE if e["event"] != "job.attempt"], "n2") is None
    assert restart_phases(TIMELINE[:6], "n2") is None  # the gang stopped, nothing started yet


def test_the_follower_places_job_ready_phases_on_their_own_times(tmp_path: Path) -> None:
    ev_dir = tmp_path / "events"
    ev_dir.mkdir()
    line = {"ts": 120.0, "kind": "startup", "source": "training", "node": "n1",
            "data": {"attempt": 1, "step": 11, "first_step_s": 0.3, "init_ts": 110.0,
                     "group_ts": 112.5, "restored_ts": 119.0}}  # fmt: skip
    (ev_dir / "training.jsonl").write_text(json.dumps(line) + "\n")
    f = Follower(ev_dir)
    f.fault_ts = 100.0
    f.read_logs()
    assert [(e["t_s"], e["event"]) for e in f.timeline()] == [
        (10.0, "worker_start"), (12.5, "rendezvous"), (19.0, "restored"), (20.0, "first_step"),
    ]  # fmt: skip


def test_an_in_process_restart_is_timed_from_the_replacement_alone() -> None:
    """In-process mode: the lost rank's pod ended and was replaced alone (job.pod_replaced);
    the survivor's own startup (its init_ts is when it lost its peer) comes before and does
    not count as a process start: the replacement's does."""
    t = [
        ev(0.0, "fault", "n2"),
        ev(1.0, "block", "n2"),
        ev(4.5, "worker_start", "n1"),  # the survivor, n1: it lost its peer then
        ev(5.0, "job.pod_replaced"),
        ev(5.25, "job.pod_scheduled", "n3"),
        ev(10.0, "worker_start", "n3"),
        ev(10.1, "rendezvous", "n1"),
        ev(10.1, "rendezvous", "n3"),
        ev(10.4, "restored", "n3"),
        ev(10.5, "first_step", "n3"),
    ]
    assert restart_phases(t, "n2") == {
        "detect": 1.0,
        "stop": 4.0,
        "reschedule": 0.25,
        "process_start": 4.75,
        "rendezvous": 0.1,
        "restore": 0.3,
        "first_step": 0.1,
    }
