"""The agent's own parsers never raise on garbage (hypothesis): scontrol output, the
remediation annotations, kernel-log records and lines, the NPD message."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.commands.npd import message
from gpuvigil.core.findings import Finding, NodeReport, Status
from gpuvigil.core.wire import decode_request
from gpuvigil.node.checks.kernel_log import kmsg_stream as ks
from gpuvigil.node.sinks import slurm as sl

text = st.text(max_size=400)


@given(text)
def test_parse_show_node_never_raises(s: str):
    out = sl.parse_show_node(s)
    assert isinstance(out, dict) and all(isinstance(v, str) for v in out.values())
    sl.is_drained(out)


@given(st.one_of(text, st.none(), st.from_regex(r'\{"id": ?"[a-z0-9]{0,8}".{0,40}\}')))
def test_remediation_decode_never_raises(s):
    v, why = decode_request(s)
    assert (v is None) == bool(why) and (v is None or isinstance(v.id, str))


@given(st.lists(text, max_size=20))
def test_kmsg_records_and_lines_never_raise(chunks: list[str]):
    health = ks.StreamHealth()
    src = ks.DevKmsg.__new__(ks.DevKmsg)  # the record logic without a device
    src.health, src.last_seq, src.overrun = health, None, False
    out: list[ks.Record] = []
    for c in chunks:
        src._take(c, out)
        ks._text_record(c, "file")
    assert len(out) == len(chunks) and health.gaps >= 0


@settings(max_examples=50)
@given(
    st.lists(
        st.tuples(st.sampled_from(["XID_79", "CHECK_TIMEOUT", "NVLINK_DOWN"]), text), max_size=5
    ),
    st.integers(min_value=8, max_value=200),
)
def test_npd_message_always_fits(findings, limit):
    report = NodeReport(
        node="n",
        findings=tuple(
            Finding(check="c", status=Status.FAILED, code=c, component=f"gpu:{i}", message=m)
            for i, (c, m) in enumerate(findings)
        ),
    )
    out = message(report, limit=limit)
    assert len(out.encode()) <= limit
    if len(findings) > 1 and limit >= 40:  # the count is never cut
        assert out.endswith(f"(+{len(findings) - 1} more)")
