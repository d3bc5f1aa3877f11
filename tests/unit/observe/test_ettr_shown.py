"""`gpuvigil report` shows ETTR beside goodput, in its table and its JSON."""

from __future__ import annotations

import pytest

from gpuvigil.core.events import Event
from gpuvigil.observe import tables
from gpuvigil.observe.summary import summarize


def _ev(ts: float, kind: str, /, **data: object) -> Event:
    return Event(ts=ts, kind=kind, source="training", job="j", data=data)


def test_report_shows_ettr_beside_goodput() -> None:
    evs = [
        _ev(0, "job.start", gpus=2),
        _ev(60, "job.restart", cause="drain", kind="drained", lost_s=10.0),
        _ev(100, "job.end", result="succeeded", exit_code=0),
    ]
    s = summarize(evs, start=0, end=100)
    slo = s.to_json()["slo"]
    assert slo["ettr"]["ratio"] == pytest.approx(0.9) and "goodput" in slo
    labels = [str(r[0]) for r in tables.slo_rows(s)]
    assert labels.index("ETTR") == labels.index("goodput") + 1
    assert s.slo.jobs_succeeded == 1 and s.slo.jobs_failed == 0
