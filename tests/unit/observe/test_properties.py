"""Property tests: SLOs and attribution never raise on any event stream, and their
figures stay in range, whatever the `data` fields hold (JSON allows NaN and Infinity)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core import exit_codes
from gpuvigil.core.events import Event
from gpuvigil.observe import summary

KINDS = ["node.state", "node.maintenance", "finding.set", "finding.cleared", "remediation",
         "breaker", "job.start", "job.restart", "job.end", "checkpoint", "straggler", "hang",
         "fault", "other"]  # fmt: skip
KEYS = ["to", "from", "in_service", "phase", "code", "component", "status", "action", "fatal",
        "result", "found", "state", "nodes", "gpus", "lost_s", "node", "exit_code", "reason",
        "productive_gpu_s", "allocated_gpu_s", "evidence_ts", "step", "dry_run"]  # fmt: skip
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 200), st.floats(allow_nan=True),
    st.sampled_from(["HEALTHY", "DRAINING", "REMOVED", "SUSPECT", "start", "end",
                     "FAILED", "XID_79", "gpu:1", "succeeded", "failed", "REBOOT", "open"]),
    st.lists(st.sampled_from(["n1", "n2", 3]), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)  # fmt: skip


@st.composite
def streams(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(0, 40))
    ts = 0.0
    out = []
    for _ in range(n):
        ts += draw(st.floats(0, 1000))
        out.append(Event(
            ts=ts, kind=draw(st.sampled_from(KINDS)), source="h",
            node=draw(st.sampled_from([None, "n1", "n2"])),
            job=draw(st.sampled_from([None, "j1", "j2"])),
            data=draw(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5)),
        ))  # fmt: skip
    return out


@settings(max_examples=150, deadline=None)
@given(streams(), st.sampled_from([None, 500.0]))
def test_summary_never_raises_and_stays_in_range(evs: list[Event], start: float | None) -> None:
    s = summary.summarize(evs, start=start)
    r = s.slo
    for ratio in (r.availability, r.job_success_rate, r.goodput, r.ettr):
        assert ratio is None or 0.0 <= ratio <= 1.0
    assert all(x >= 0 for x in r.mttd.samples + r.mttr.samples)
    assert r.false_positive_drains <= r.drains
    assert s.attribution.total == sum(s.attribution.by_cause.values())
    for a in s.attribution.attributions:
        assert a.cause in {c.value for c in exit_codes.FAILURES} and 0.0 <= a.confidence <= 1.0
    assert 0 <= s.attribution.without_cause <= s.attribution.total
    json.dumps(s.to_json(), allow_nan=False)  # the --json output is strict JSON
