"""Xid events that only a person's release clears survive a reboot (`node.xid_state`):
kept across a boot change, bounded, atomic, dropped at a release; broken state is a
WARNING and a fresh start, never a crash."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import Status
from gpuvigil.node import xid_state
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.kernel_log.kmsg_stream import Record
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.kernel_watch import KernelStreamConfig, KernelWatch

T = datetime(2026, 11, 30, 7, 31, 2, tzinfo=UTC)


def line(code: int, at: datetime = T, bus: str = "0000:3b:00", text: str = "x") -> str:
    stamp = at.isoformat().replace(".", ",")
    return f"{stamp} NVRM: Xid (PCI:{bus}): {code}, pid=1, name=python3, {text}"


def watch(root: Path, boot: str, state: Path | None) -> KernelWatch:
    """The kernel watch of a node whose boot id is `boot` (read below the agent's root)."""
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    log = root / "kern.log"
    log.write_text("")
    config = KernelStreamConfig(source="file", file=log)
    ctx = CheckContext(config=NodeConfig(expect_gpus=0), root=root, env={"PATH": ""})
    return KernelWatch(config, ctx=ctx, changed=threading.Event(), metrics=None, state_dir=state)


def codes(w: KernelWatch) -> dict[str, object]:
    return {f.code: f for f in w.snapshot(time.monotonic())[0]}


def test_investigate_xid_survives_a_reboot_and_a_release_clears_it(tmp_path):
    state = tmp_path / "state"
    w = watch(tmp_path, "boot-a", state)
    # Xid 54 (aux power, INVESTIGATE) and Xid 79 (fell off the bus, REBOOT) in boot a.
    w._on_records([Record(line(54), "file"), Record(line(79), "file")], True)
    assert {"XID_54", "XID_79"} <= set(codes(w))
    kept = json.loads((state / xid_state.EVENTS_FILE).read_text())["events"]
    assert [(e["code"], e["boot_id"]) for e in kept] == [(54, "boot-a")]  # only what needs a person

    w2 = watch(tmp_path, "boot-b", state)  # rebooted: the new boot's log has no Xid
    found = codes(w2)
    assert "XID_54" in found and "XID_79" not in found  # the reboot cleared only Xid 79
    f54 = found["XID_54"]
    assert f54.status is Status.FAILED and f54.action.value == "INVESTIGATE"
    assert line(54) in f54.evidence["lines"]

    # A person released the node (the Kubernetes annotation, read by the sink's thread).
    w2.release(T + timedelta(hours=1))
    assert "XID_54" not in codes(w2)
    assert json.loads((state / xid_state.EVENTS_FILE).read_text())["events"] == []
    # ... and stays released after the next restart; a later Xid still counts.
    w3 = watch(tmp_path, "boot-b", state)
    assert "XID_54" not in codes(w3)
    w3._on_records([Record(line(54, T + timedelta(hours=2)), "file")], False)
    assert "XID_54" in codes(w3)


def test_local_release_marker_file(tmp_path):
    state = tmp_path / "state"
    w = watch(tmp_path, "boot-a", state)
    w._on_records([Record(line(54), "file")], True)
    w = watch(tmp_path, "boot-b", state)
    assert "XID_54" in codes(w)
    (state / xid_state.RELEASE_FILE).write_text("not a time\n")
    assert "XID_54" in codes(w)  # garbage is no release
    (state / xid_state.RELEASE_FILE).write_text((T + timedelta(minutes=5)).isoformat() + "\n")
    assert "XID_54" not in codes(w)


def test_restart_in_the_same_boot_does_not_duplicate(tmp_path):
    state = tmp_path / "state"
    for _ in range(3):  # the agent restarts, re-reading the same boot's log each time
        w = watch(tmp_path, "boot-a", state)
        w._on_records([Record(line(54), "file")], True)
    kept = json.loads((state / xid_state.EVENTS_FILE).read_text())["events"]
    assert len(kept) == 1
    assert codes(w)["XID_54"].evidence["count"] == 1


def test_corrupt_state_is_a_warning_and_a_fresh_start(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / xid_state.EVENTS_FILE).write_bytes(b'{"v":1,"events":[{"code": 54, "ki')
    w = watch(tmp_path, "boot-a", state)
    (warn,) = [f for f in w.snapshot(time.monotonic())[0] if f.code == xid_state.CODE]
    assert warn.status is Status.WARNING and "cannot read" in warn.message
    w._on_records([Record(line(54), "file")], True)  # and it keeps working
    doc = json.loads((state / xid_state.EVENTS_FILE).read_text())
    assert [e["code"] for e in doc["events"]] == [54]
    assert xid_state.CODE in codes(w)  # until a person releases the node
    w.release(T - timedelta(days=1))
    assert xid_state.CODE not in codes(w) and "XID_54" in codes(w)


def test_wrong_shapes_and_bad_events_are_skipped_or_a_warning(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    path = state / xid_state.EVENTS_FILE
    path.write_text(json.dumps([1, 2]))
    s = xid_state.XidState(state)
    assert s.load() == [] and s.problems()[0].code == xid_state.CODE
    good = xid_state.encode_event(
        xid_state.decode_event(
            {
                "kind": "xid",
                "code": 54,
                "pci_bus_id": "0000:3b:00",
                "bus_id": "0000:3b:00.0",
                "message": "m",
                "line": "l",
                "time": T.isoformat(),
                "boot_id": "a",
            }
        )
    )  # type: ignore[arg-type]
    path.write_text(
        json.dumps(
            {
                "v": 1,
                "events": [
                    good,
                    {"code": "x"},
                    7,
                    {"bogus": 1},
                    {**good, "time": "2026-01-01T00:00"},
                ],
            }
        )
    )
    s = xid_state.XidState(state)
    assert [e.code for e in s.load()] == [54] and not s.problems()


def test_size_is_bounded(tmp_path):
    state = tmp_path / "state"
    w = watch(tmp_path, "boot-a", state)
    n = xid_state.MAX_EVENTS + 44
    long = "y" * 5000
    w._on_records(
        [Record(line(54, T + timedelta(seconds=i), text=f"{i} {long}"), "file") for i in range(n)],
        True,
    )
    path = state / xid_state.EVENTS_FILE
    kept = json.loads(path.read_text())["events"]
    assert len(kept) == xid_state.MAX_EVENTS
    assert kept[-1]["message"].startswith(f"{n - 1} ")  # the newest are kept
    assert all(len(e["line"]) <= xid_state.MAX_LINE for e in kept)
    assert path.stat().st_size < xid_state.MAX_BYTES
    path.write_bytes(b" " * (xid_state.MAX_BYTES + 1))  # too big: not read at all
    s = xid_state.XidState(state)
    assert s.load() == [] and "larger than" in s.problems()[0].message


def test_unwritable_state_dir_is_a_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the folder should be: mkdir fails (also as root)
    w = watch(tmp_path, "boot-a", blocker / "state")
    w._on_records([Record(line(54), "file")], True)
    found = codes(w)
    assert "XID_54" in found
    assert found[xid_state.CODE].status is Status.WARNING
    assert "cannot write" in found[xid_state.CODE].message


def test_write_is_atomic(tmp_path):
    state = tmp_path / "state"
    w = watch(tmp_path, "boot-a", state)
    w._on_records([Record(line(54), "file")], True)
    assert [p.name for p in state.iterdir()] == [xid_state.EVENTS_FILE]  # no temp left
    assert os.stat(state / xid_state.EVENTS_FILE).st_size > 0


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda c: (
            st.lists(c, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    ["kind", "code", "time", "line", "message", "pci_bus_id", "boot_id", "seq", "x"]
                ),
                c,
                max_size=6,
            )
        ),
        max_leaves=12,
    )
)
def test_decode_event_never_raises(raw):
    xid_state.decode_event(raw)


def test_decoded_events_have_the_right_types():
    base = {"kind": "xid", "code": 54, "pci_bus_id": "p", "message": "m", "line": "l"}
    assert xid_state.decode_event(base) is not None
    for bad in (
        {"seq": "1"},
        {"source": 3},
        {"source": "tcp"},
        {"boot_id": 1},
        {"uptime_s": "2"},
        {"code": True},
        {"time": "2026-01-01T00:00:00"},
    ):
        assert xid_state.decode_event({**base, **bad}) is None, bad
