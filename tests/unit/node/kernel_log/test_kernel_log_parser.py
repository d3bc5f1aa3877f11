"""The kernel-log parser: every common prefix, SXid, non-events, kmsg, corpus, garbage."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.node.bus_ids import normalize_bus_id
from gpuvigil.node.checks.kernel_log.kernel_log_parser import (
    driver_load_stamp,
    iter_stream,
    kmsg_records,
    parse_kmsg_record,
    parse_line,
    scan_bytes,
    with_wall_time,
)

BODY = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
T = datetime(2026, 11, 30, 7, 31, 2, tzinfo=UTC)

# (line, timestamp as printed, wall time, uptime_s)
PREFIXES = [
    (f"[  123.456789] {BODY}", "123.456789", None, 123.456789),
    (f"<4>[ 8123.000001] {BODY}", "8123.000001", None, 8123.000001),
    (f"[Mon Nov 30 07:31:02 2026] {BODY}", "Mon Nov 30 07:31:02 2026", T, None),
    (f"[Mon Nov  2 07:31:02 2026] {BODY}", "Mon Nov  2 07:31:02 2026", T.replace(day=2), None),
    (
        f"2026-11-30T07:31:02,123456+00:00 {BODY}",
        "2026-11-30T07:31:02,123456+00:00",
        T.replace(microsecond=123456),
        None,
    ),
    (
        f"kern  :warn  : 2026-11-30T07:31:02,000000+00:00 {BODY}",
        "2026-11-30T07:31:02,000000+00:00",
        T,
        None,
    ),
    (
        f"2026-11-30T08:31:02+0100 gpu-node-7 kernel: {BODY}",
        "2026-11-30T08:31:02+0100",
        T,
        None,
    ),
    (
        f"2026-11-30T07:31:02.500000+00:00 gpu-node-7 kernel: {BODY}",
        "2026-11-30T07:31:02.500000+00:00",
        T.replace(microsecond=500000),
        None,
    ),
    (f"Nov 30 07:31:02 gpu-node-7 kernel: {BODY}", "Nov 30 07:31:02", T, None),
    (
        f"Nov 30 07:31:02.250000 gpu-node-7 kernel: {BODY}",
        "Nov 30 07:31:02.250000",
        T.replace(microsecond=250000),
        None,
    ),
    (
        f"Nov 30 07:31:02 gpu-node-7 kernel: [  777.125000] {BODY}",
        "Nov 30 07:31:02",
        T,
        777.125,
    ),
    (
        f"Mon 2026-11-30 07:31:02 UTC gpu-node-7 kernel: {BODY}",
        "Mon 2026-11-30 07:31:02 UTC",
        T,
        None,
    ),
    (
        f"Mon 2026-11-30 08:31:02 +0100 gpu-node-7 kernel: {BODY}",
        "Mon 2026-11-30 08:31:02 +0100",
        T,
        None,
    ),
    (
        f"Mon 2026-11-30 07:31:02 CET gpu-node-7 kernel: {BODY}",
        "Mon 2026-11-30 07:31:02 CET",
        None,
        None,
    ),
    (
        f"{T.timestamp():.6f} gpu-node-7 kernel: {BODY}",
        f"{T.timestamp():.6f}",
        T,
        None,
    ),
    # dmesg -H / --time-format reltime: the minute line has a wall time (with a year), the
    # deltas after it have none of their own.
    (f"[Nov30 07:31] {BODY}", "Nov30 07:31", T.replace(second=0), None),
    (f"[  +0.000004] {BODY}", "+0.000004", None, None),
    (f"[  812.441210 <    0.000004>] {BODY}", "812.441210 <    0.000004>", None, 812.44121),
    (f"{BODY}", None, None, None),
]


@pytest.mark.parametrize(("line", "stamp", "when", "uptime"), PREFIXES)
def test_every_prefix(line, stamp, when, uptime):
    ev = parse_line(line, year=2026)
    assert ev is not None
    assert (ev.kind, ev.code, ev.pci_bus_id, ev.bus_id) == ("xid", 79, "0000:3b:00", "0000:3b:00.0")
    assert (ev.pid, ev.process, ev.message) == (4242, "python3", "GPU has fallen off the bus.")
    assert ev.timestamp == stamp
    assert ev.time == when
    assert ev.uptime_s == uptime
    assert ev.line == line


def test_syslog_without_year_has_no_wall_time():
    ev = parse_line(f"Nov 30 07:31:02 gpu-node-7 kernel: {BODY}")
    assert ev is not None and ev.timestamp == "Nov 30 07:31:02" and ev.time is None


def test_impossible_stamp_keeps_the_event_without_time():
    ev = parse_line(f"[Mon Feb 30 07:31:02 2026] {BODY}")
    assert ev is not None and ev.code == 79 and ev.time is None


def test_naive_stamps_take_the_given_zone():
    plus2 = timezone(timedelta(hours=2))
    ev = parse_line(f"[Mon Nov 30 09:31:02 2026] {BODY}", tz=plus2)
    assert ev is not None and ev.time == T


@pytest.mark.parametrize(
    ("line", "want"),
    [
        # older drivers: no "PCI:" and no pid/name
        (
            "[ 55.1] NVRM: Xid (0000:af:00): 31, Ch 00000010, engmask 00000101",
            ("xid", 31, "0000:af:00", None, None, "Ch 00000010, engmask 00000101"),
        ),
        (
            "[ 55.1] NVRM: Xid (PCI:0000:19:00): 94, pid='<unknown>', name=<unknown>, Ch 0000000a",
            ("xid", 94, "0000:19:00", None, None, "Ch 0000000a"),
        ),
        (
            "[ 55.1] nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Non-fatal, Link 12 "
            "egress non-posted PRIV error (First)",
            (
                "sxid",
                12028,
                "0000:c6:00.0",
                None,
                None,
                "Non-fatal, Link 12 egress non-posted PRIV error (First)",
            ),
        ),
        (
            "[ 55.2] nvidia-nvswitch3: SXid (PCI:0000:c6:00.0): 12028, Data {0x0, 0x1}",
            ("sxid", 12028, "0000:c6:00.0", None, None, "Data {0x0, 0x1}"),
        ),
        # GB200-style domain
        (
            "[ 9.0] NVRM: Xid (PCI:0018:01:00): 149, pid=77, name=train, NETIR_LINK_EVT Fatal",
            ("xid", 149, "0018:01:00", 77, "train", "NETIR_LINK_EVT Fatal"),
        ),
    ],
)
def test_variants(line, want):
    ev = parse_line(line)
    assert ev is not None
    assert (ev.kind, ev.code, ev.pci_bus_id, ev.pid, ev.process, ev.message) == want
    if ev.kind == "sxid":
        assert ev.device == "nvidia-nvswitch3"
        assert ev.code_name == "SXID_12028"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "[  1.0] usb 1-1: new high-speed USB device",
        "[  2.0] NVRM: _kgspLogXid119: ********** GSP Timeout **********",
        "[  2.0] NVRM: GPU4 Reset required, caused by previous Xid 149 on link 3",
        "[  2.0] NVRM: Xid is a driver error report",
        "[  2.0] fooXid (PCI:0000:3b:00): 79, nope",
        "[  2.0] NVRM: Xid (PCI:0000:3b:00)",
    ],
)
def test_non_events(line):
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("line", "code", "message"),
    [
        (
            "[  2.0] NVRM: Xid (PCI:0000:3b:00): not-a-number",
            -1,
            "[unreadable code 'not-a-number']",
        ),
        ("[  2.0] NVRM: Xid (PCI:0000:3b:00): 0x4f, Ch 1", -1, "[unreadable code '0x4f'] Ch 1"),
        ("[  2.0] NVRM: Xid (PCI:0000:3b:00): -79, Ch 1", -79, "Ch 1"),
    ],
)
def test_an_odd_code_is_an_event_never_a_dropped_line(line, code, message):
    # A line in the event's own shape whose code is not a plain number is kept: an
    # unknown code (-1 when it is no number) that the rules judge, never silence.
    ev = parse_line(line)
    assert ev is not None and (ev.code, ev.message) == (code, message)


def test_kmsg_record_with_continuation_lines():
    raw = (
        b"4,80211,5678901234,-;NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', "
        b"name=<unknown>, An uncorrectable double bit error (DBE) has been detected.\n"
        b" SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"
    )
    ev = parse_kmsg_record(raw, boot_id="b1")
    assert ev is not None
    assert (ev.code, ev.seq, ev.uptime_s, ev.source, ev.boot_id) == (
        48,
        80211,
        5678.901234,
        "kmsg",
        "b1",
    )
    assert ev.timestamp == "5678901234"
    assert parse_kmsg_record(b"6,1,2,-;usb 1-1: hello") is None
    assert parse_kmsg_record(b"not a record NVRM: Xid (PCI:0000:3b:00): 79, x") is None
    assert parse_kmsg_record("4,9,10,c,more;NVRM: Xid (PCI:0000:3b:00): 13, x").code == 13


def test_kmsg_records_splits_a_capture():
    data = b"6,1,10,-;a\n SUBSYSTEM=x\n4,2,20,-;NVRM: Xid (PCI:0000:3b:00): 13, x\n\n"
    recs = kmsg_records(data)
    assert recs == [b"6,1,10,-;a\n SUBSYSTEM=x", b"4,2,20,-;NVRM: Xid (PCI:0000:3b:00): 13, x"]


def test_driver_load_line():
    s = driver_load_stamp(
        "[   12.5] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5 2024"
    )
    assert s is not None and s.uptime_s == 12.5
    assert driver_load_stamp("[   12.5] nvidia: module license taints kernel.") is None


def test_scan_and_stream_agree_across_chunk_boundaries():
    lines = [f"[{i}.0] noise line {i}" for i in range(300)]
    for i in range(0, 300, 7):
        lines[i] = f"[{i}.0] NVRM: Xid (PCI:0000:{i % 256:02x}:00): {i}, pid=1, name=a, m"
    data = "\n".join(lines).encode()  # no trailing newline, like a truncated capture
    whole = scan_bytes(data)
    streamed = list(iter_stream(io.BytesIO(data), chunk_size=97))
    assert [e.code for e in whole] == list(range(0, 300, 7))
    assert streamed == whole


def test_two_events_on_one_line_count_once():
    data = f"[1.0] {BODY} {BODY}\n".encode()
    assert len(scan_bytes(data)) == 1


def test_wall_time_from_boot_time():
    ev = parse_line(f"[  60.0] {BODY}")
    booted = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)
    (out,) = with_wall_time([ev], booted)
    assert out.time == booted + timedelta(seconds=60)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0000:3b:00", "0000:3b:00.0"),
        ("PCI:0000:3B:00", "0000:3b:00.0"),
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("00000018:01:00.0", "0018:01:00.0"),
        ("3b:00", "0000:3b:00.0"),
        ("gpu0", None),
        ("", None),
    ],
)
def test_normalize_bus_id(text, want):
    assert normalize_bus_id(text) == want


# --- the real-world corpus (../shared/corpus) ---------------------------------------------


def _manifest(corpus):
    with (corpus / "kernel_logs" / "MANIFEST.tsv").open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_corpus_ground_truth(corpus):
    rows = _manifest(corpus)
    assert rows
    for row in rows:
        data = (corpus / "kernel_logs" / row["file"]).read_bytes()
        events = scan_bytes(data)
        xids: list[int] = []
        for ev in events:
            if ev.kind == "xid" and ev.code not in xids:
                xids.append(ev.code)
        want = [int(c) for c in row["xid_codes_present"].split(",") if c]
        assert xids == want, row["file"]
        sxids = sorted({e.code for e in events if e.kind == "sxid"})
        assert sxids == sorted(int(c) for c in row["sxid_codes_present"].split(",") if c)
        printed = {f"PCI:{e.pci_bus_id}" for e in events}
        assert printed == set(row["pci_bus_ids_present"].split(";")), row["file"]
        counts = dict(p.strip().split("=") for p in row["notes"].split(";")[:2])
        assert sum(e.kind == "xid" for e in events) == int(counts["xid_event_lines"])
        assert sum(e.kind == "sxid" for e in events) == int(counts["sxid_event_lines"])
        # line by line gives the same answer as the bulk scanner
        by_line = [parse_line(t) for t in data.decode("utf-8", "replace").splitlines()]
        assert [e for e in by_line if e is not None] == events


# --- garbage never raises ------------------------------------------------------------------

_ATOMS = st.sampled_from(
    [
        "Xid (",
        "SXid (",
        "PCI:",
        "0000:3b:00",
        "): ",
        "79",
        ", ",
        "pid=",
        "name=",
        "[",
        "]",
        "<4>",
        "kern  :warn  : ",
        "2026-02-30T25:61:61,1+99:99 ",
        "Feb 31 99:99:99 h kernel: ",
        "[Mon Feb 30 07:31:02 2026]",
        "6,1,99999999999999999999,-;",
        "nvidia-nvswitch0: ",
        "\x00",
        "\udcff",
        "\n",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_ATOMS, st.text(max_size=8)), max_size=14).map("".join))
def test_parse_line_never_raises(text):
    ev = parse_line(text, year=2026)
    assert ev is None or isinstance(ev.code, int)
    parse_kmsg_record(text)
    driver_load_stamp(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_bytes_never_raise(data):
    scan_bytes(data)
    parse_kmsg_record(data)
    kmsg_records(data)
    list(iter_stream(io.BytesIO(data), chunk_size=16))
