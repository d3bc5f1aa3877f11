"""The event reader: real files written by EventWriter, torn and garbage lines skipped."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.observe import events as reader


def _write(path: Path, evs: list[Event]) -> None:
    with EventWriter(path) as w:
        for e in evs:
            w.write(e)


def test_round_trip_through_the_writer(tmp_path: Path) -> None:
    evs = [
        Event(ts=1.0, kind=Kind.NODE_STATE, source="controller", node="n1", data={"to": "HEALTHY"}),
        Event(ts=2.5, kind=Kind.JOB_START, source="training", job="j1", data={"gpus": 8}),
    ]
    _write(tmp_path / "e.jsonl", evs)
    stats = reader.ReadStats()
    got = list(reader.read_file(tmp_path / "e.jsonl", stats=stats))
    assert got == evs
    assert (stats.lines, stats.events, stats.skipped_total) == (2, 2, 0)


def test_parsed_event_behaves_like_a_validated_one() -> None:
    built = Event(ts=5, kind="hang", source="t", job="j", data={"rank": 1})
    parsed, reason = reader.parse_line(built.to_line())
    assert reason == "" and parsed == built and parsed.to_line() == built.to_line()
    assert parsed.model_dump() == built.model_dump()
    with pytest.raises(ValidationError):
        parsed.ts = 6.0  # frozen like any Event


def test_torn_last_line_and_garbage_are_skipped_with_warnings(tmp_path: Path) -> None:
    good = Event(ts=1.0, kind="node.state", source="c", node="n1").to_line()
    p = tmp_path / "e.jsonl"
    p.write_bytes(
        (
            good
            + "\n"
            + "garbage{\n"
            + "[1,2]\n"
            + "nul\n"
            + "\n"
            + '{"ts":"x","kind":"a","source":"b"}\n'
            + '{"ts":1,"kind":"a","source":"b","extra":1}\n'
            + "\xff\xfe\n"
            + good
            + "\n"
            + good[:20]
        ).encode("utf-8", "surrogateescape")
    )
    warnings: list[str] = []
    stats = reader.ReadStats()
    got = list(reader.read_file(p, stats=stats, warn=warnings.append))
    assert len(got) == 2
    assert stats.skipped == {
        "not JSON": 3,
        "not a JSON object": 1,
        "bad ts": 1,
        "unknown envelope field": 1,
        "torn last line": 1,
    }
    assert stats.blank == 1
    assert any("torn last line" in w for w in warnings)
    assert len(warnings) == reader.WARN_LIMIT + 2  # + the torn line + one summary line


def test_last_line_without_newline_is_kept_when_whole(tmp_path: Path) -> None:
    p = tmp_path / "e.jsonl"
    p.write_text(Event(ts=3.0, kind="hang", source="t").to_line())
    assert [e.ts for e in reader.read_file(p)] == [3.0]


def test_over_long_line_is_skipped_without_reading_it_whole() -> None:
    big = b'{"ts": 1, "kind": "x", "source": "' + b"a" * (reader.MAX_LINE_BYTES * 2) + b'"}\n'
    good = Event(ts=2.0, kind="hang", source="t").to_line().encode() + b"\n"
    stats = reader.ReadStats()
    got = list(reader.read_stream(io.BytesIO(big + good), stats=stats))
    assert [e.ts for e in got] == [2.0]
    assert stats.skipped_total == 1


def test_missing_file_is_counted_not_raised(tmp_path: Path) -> None:
    stats = reader.ReadStats()
    warnings: list[str] = []
    assert list(reader.read_file(tmp_path / "nope", stats=stats, warn=warnings.append)) == []
    assert stats.skipped == {"unreadable file": 1} and warnings


def test_files_are_merged_in_time_order(tmp_path: Path) -> None:
    _write(tmp_path / "a", [Event(ts=t, kind="a", source="s") for t in (1, 4, 6)])
    _write(tmp_path / "b", [Event(ts=t, kind="b", source="s") for t in (2, 3, 7)])
    got = [e.ts for e in reader.read_events([tmp_path / "a", tmp_path / "b"])]
    assert got == [1, 2, 3, 4, 6, 7]


def test_last_timestamp_reads_the_tail(tmp_path: Path) -> None:
    p = tmp_path / "e"
    _write(p, [Event(ts=float(t), kind="a", source="s") for t in range(5000)])
    with p.open("ab") as f:
        f.write(b'{"ts": 99999, "kin')  # torn
    assert reader.last_timestamp(p) == 4999.0
    assert reader.last_timestamp(tmp_path / "missing") is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_reader_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    stats = reader.ReadStats()
    for e in reader.read_stream(io.BytesIO(data), stats=stats):
        assert isinstance(e.ts, float)
    assert stats.events + stats.skipped_total + stats.blank == stats.lines


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=8,
    )
)
def test_parse_line_never_raises_on_any_json(obj: object) -> None:
    ev, reason = reader.parse_line(json.dumps(obj))
    assert (ev is None) != (reason == "")
