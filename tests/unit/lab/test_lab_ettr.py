"""The lab's job record shows the ETTR `gpuvigil report` computes from the fault's events."""

from __future__ import annotations

import pytest

from gpuvigil.core.events import Event
from gpuvigil.lab.result import ettr_of
from gpuvigil.observe.summary import summarize


def test_the_job_record_takes_the_reports_ettr() -> None:
    def ev(ts: float, kind: str, /, **data: object) -> Event:
        return Event(ts=ts, kind=kind, source="training", job="j", data=data)

    evs = [
        ev(0, "job.start", gpus=2),
        ev(60, "job.restart", cause="drain", kind="drained", lost_s=10.0),
        ev(100, "job.end", result="succeeded", exit_code=0),
    ]
    report = summarize(evs, start=0, end=100).to_json()
    assert ettr_of(report) == pytest.approx(0.9)  # (100 - 10) s productive of 100 s wall
    assert ettr_of({}) is None and ettr_of({"error": "exited 1"}) is None
