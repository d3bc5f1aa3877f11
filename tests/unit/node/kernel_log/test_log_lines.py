"""`log_lines.iter_lines`: hostile shapes of a log stream (bare CR, a 10 MB line, a stream
far larger than memory should hold) still give every needle, within bounded memory."""

from __future__ import annotations

import io
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.node.checks.kernel_log.kernel_log_parser import iter_stream
from gpuvigil.node.checks.kernel_log.log_lines import LineStats, iter_lines

XID = b"[  12.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."


def lines(data: bytes, *needles: bytes, **kw) -> list[bytes]:
    return list(iter_lines(io.BytesIO(data), needles or (b"Xid (",), **kw))


@pytest.mark.parametrize("chunk", [7, 64, 4096, 1 << 20])
def test_every_line_found_once_whatever_the_chunk(chunk: int) -> None:
    data = b"".join(b"noise %d\n" % i + (XID + b"\n" if i % 3 == 0 else b"") for i in range(60))
    assert lines(data, chunk_size=chunk) == [XID] * 20


def test_bare_cr_ends_a_line() -> None:
    data = b"a\r" + XID + b"\rb\r" + XID + b"\r\n" + XID
    assert lines(data) == [XID] * 3
    events = list(iter_stream(io.BytesIO(data)))
    assert len(events) == 3 and all(e.code == 79 for e in events)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_an_xid_in_a_10mb_line_is_found(where: str) -> None:
    pad = b"x" * (10 * 1024 * 1024)
    line = {"start": XID + pad, "middle": pad[:5_000_000] + XID + pad, "end": pad + XID}[where]
    stats = LineStats()
    found = list(
        iter_stream(io.BytesIO(b"ok\n" + line + b"\nok\n"), chunk_size=1 << 20, stats=stats)
    )
    assert [e.code for e in found] == [79]
    assert stats.long_lines == 1
    if where == "start":
        assert found[0].uptime_s == 12.5  # the line's own time stamp is kept


def test_several_needles_one_line_each() -> None:
    data = b"x Xid (a\nNVRM: loading NVIDIA UNIX x\nboth Xid ( and NVRM: loading NVIDIA UNIX\n"
    assert len(lines(data, b"Xid (", b"NVRM: loading NVIDIA UNIX")) == 3


def test_memory_stays_bounded_on_a_large_stream() -> None:
    block = (b"kernel: something unrelated happened here " * 3 + b"\n") * 20000
    data = block * 40  # ~100 MB
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_lines(io.BytesIO(data), (b"Xid (",), chunk_size=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 0
    assert peak < 16 * 1024 * 1024, peak  # about one chunk, not the stream


def test_max_bytes_stops_and_says_so() -> None:
    stats = LineStats()
    got = lines(XID + b"\n" + b"y" * 1000 + b"\n" + XID, max_bytes=200, stats=stats)
    assert got == [XID] and stats.truncated and stats.bytes_read == 200


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([b"\n", b"\r", b"\r\n", b"abc", XID, b"\x00", b"Xid ("]), max_size=60),
    st.integers(1, 50),
)
def test_chunking_never_changes_what_is_found(parts: list[bytes], chunk: int) -> None:
    data = b"".join(parts)
    assert lines(data, chunk_size=chunk) == lines(data, chunk_size=1 << 20)
