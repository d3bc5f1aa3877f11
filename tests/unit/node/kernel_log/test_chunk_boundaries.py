"""Chunk boundaries: the scanners read a log in chunks (logscan's one needle, the capture
reader's many), and what they find must not depend on where a chunk ends: a marker split
across two chunks, a line longer than a chunk, no newline at the end, CRLF line ends, NUL
bytes. Each case is read with every chunk size that cuts it somewhere new and compared
with one read in a single chunk."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest

from gpuvigil.node.checks.kernel_log import kernel_log_capture
from gpuvigil.node.checks.kernel_log.kernel_log_parser import iter_stream

NOW = datetime(2026, 12, 1, tzinfo=UTC)
XID = b"[  812.441210] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
FAULT = b"[  813.000000] NVRM: GPU 0000:1b:00.0: RmInitAdapter failed! (0x22:0x56:894)"
PHRASE = b"[  814.000000] mlx5_core 0000:0c:00.0: health compromised - reached miss count"
LOAD = b"2026-11-30T07:00:00,000000+00:00 NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15"
NOISE = b"[    1.000000] pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200"

CASES = {
    "lf": b"\n".join([NOISE, LOAD, XID, NOISE, FAULT, PHRASE, XID]) + b"\n",
    "no trailing newline": b"\n".join([NOISE, LOAD, XID, FAULT, PHRASE, XID]),
    "crlf": b"\r\n".join([NOISE, LOAD, XID, FAULT, PHRASE, XID]) + b"\r\n",
    "nul bytes": b"\n".join([b"\x00" * 300, LOAD, XID + b"\x00\x00", b"\x00" + FAULT, PHRASE])
    + b"\n\x00",
    "a line longer than a chunk": b"\n".join([NOISE, b"y" * 700 + XID, LOAD, FAULT, PHRASE])
    + b"\n",
}


def _events(data: bytes, chunk: int) -> list[tuple[int, str, float | None]]:
    return [
        (e.code, e.pci_bus_id, e.uptime_s) for e in iter_stream(io.BytesIO(data), chunk_size=chunk)
    ]


def _capture(data: bytes, chunk: int) -> tuple[object, ...]:
    cap = kernel_log_capture.read_capture(io.BytesIO(data), tz=UTC, now=NOW, chunk_size=chunk)
    log = cap.log
    return (
        [(e.code, e.bus_id, e.uptime_s) for e in log.events],
        [(f.kind, f.bus_id, f.uptime_s) for f in log.faults],
        log.driver_loaded_at,
        sorted((h.phrase, h.count) for h in cap.phrases),
        cap.unreadable,
    )


def _chunks() -> list[int]:
    """Chunk sizes that put a boundary inside each marker of the log at many offsets
    (small sizes), and a few that cut lines in the middle."""
    return [*range(1, 40), 61, 97, 128, 333, 512, 1000]


@pytest.mark.parametrize("case", sorted(CASES))
def test_logscan_finds_the_same_events_whatever_the_chunk(case: str) -> None:
    data = CASES[case]
    whole = _events(data, 1 << 20)
    assert [code for code, _, _ in whole] == [79] * data.count(b"Xid (")
    for chunk in _chunks():
        assert _events(data, chunk) == whole, chunk


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_capture_reader_finds_the_same_whatever_the_chunk(case: str) -> None:
    data = CASES[case]
    whole = _capture(data, 1 << 20)
    events, faults, loaded, said, unreadable = whole
    assert len(events) == data.count(b"Xid (") and faults and loaded is not None
    assert dict(said)["mlx5-health"] == 1 and dict(said)["xid"] == len(events)
    assert unreadable is None
    for chunk in _chunks():
        assert _capture(data, chunk) == whole, chunk


def test_a_marker_split_at_every_offset_is_found() -> None:
    """The marker itself straddles the boundary, at each of its bytes in turn."""
    for needle, line in ((b"Xid (", XID), (b"health compromised", PHRASE)):
        at = line.index(needle)
        for cut in range(1, len(needle)):
            data = NOISE + b"\n" + line + b"\n"
            chunk = len(NOISE) + 1 + at + cut  # the first chunk ends inside the needle
            got = _capture(data, chunk)
            assert got == _capture(data, 1 << 20), (needle, cut)
            assert got[0] or got[3], (needle, cut)
