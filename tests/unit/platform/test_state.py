"""The node record's encodings never raise on garbage, and round-trip."""

from __future__ import annotations

from datetime import timedelta

from helpers import CANNOT_RUN, FATAL, INVESTIGATE, NONFATAL, T0, view
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import Action
from gpuvigil.platform.policy import Fleet, decide
from gpuvigil.platform.state import (
    AgentResult,
    Preflight,
    Record,
    State,
    decode_record,
    parse_tag,
)


@settings(deadline=None)
@given(st.text())
def test_decoders_never_raise(text: str) -> None:
    decode_record(text)
    parse_tag(text)
    parse_tag("gpuvigil:" + text)


def test_round_trips() -> None:
    rec = Record(
        state=State.REMEDIATING,
        since=T0,
        step=Action.REBOOT,
        code="XID_79",
        request_id="n.reboot.1",
        failures=1,
    )
    rec = rec.moved(State.VALIDATING, at=T0 + timedelta(seconds=5), reason="done")
    assert decode_record(rec.encode()) == rec
    assert parse_tag(rec.tag()) == (State.VALIDATING, Action.REBOOT, "XID_79")
    assert parse_tag("disk replacement") is None


def test_history_is_bounded() -> None:
    rec = Record()
    for i in range(40):
        rec = rec.moved(State.SUSPECT if i % 2 else State.HEALTHY, at=T0, reason=str(i))
    assert len(rec.history) == 12


findings = st.lists(st.sampled_from([FATAL, NONFATAL, INVESTIGATE, CANNOT_RUN]), max_size=3)
records = st.builds(
    Record,
    state=st.sampled_from(list(State)),
    since=st.sampled_from([None, T0 - timedelta(seconds=30), T0 - timedelta(days=1)]),
    step=st.sampled_from([None, Action.RESET_GPU, Action.REBOOT, Action.REPLACE]),
    request_id=st.sampled_from(["", "r1"]),
    issued=st.sampled_from(["", "r1"]),
    failures=st.integers(0, 5),
    last_action_at=st.sampled_from([None, T0 - timedelta(seconds=60)]),
    last_step_done_at=st.sampled_from([None, T0 - timedelta(hours=1)]),
)


@settings(deadline=None, max_examples=200)
@given(
    fs=findings,
    rec=st.one_of(st.none(), records),
    running=st.integers(0, 3),
    others=st.sampled_from([(), ("cordon",)]),
    readable=st.booleans(),
    may=st.booleans(),
    result=st.sampled_from([None, AgentResult("r1", True), AgentResult("r1", False)]),
    pf=st.sampled_from([None, Preflight(True, T0), Preflight(False, T0)]),
)
def test_policy_never_raises_and_keeps_its_promises(
    fs, rec, running, others, readable, may, result, pf
) -> None:  # type: ignore[no-untyped-def]
    kw = {} if readable else {"health": None, "health_error": "unreadable"}
    node = view(
        *fs,
        record=rec,
        running=running,
        blocked_by_others=others,
        agent_result=result,
        preflight=pf,
        **kw,
    )
    d = decide(node, fleet=Fleet(may, "" if may else "budget"), now=T0)
    kinds = {op.kind.value for op in d.ops}
    before = rec.state if rec else State.HEALTHY
    if not may and d.disruptive:
        raise AssertionError("a disruption without budget")
    if "drain" in kinds:  # a HEALTHY node (no FAILED finding, nothing in flight) never drains
        assert d.state is State.DRAINING
        assert before is not State.HEALTHY or (readable and any(f.fatal for f in fs))
    if not readable and before in (State.HEALTHY, State.SUSPECT):
        assert d.state in (State.HEALTHY, State.SUSPECT, State.QUARANTINED, State.VALIDATING)
        assert not d.disruptive  # unknown data never starts a disruption
    if others and rec is None:
        assert not d.ops or {o.kind.value for o in d.ops} <= {"unblock"}
