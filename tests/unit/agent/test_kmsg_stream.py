"""The kernel-log stream sources: /dev/kmsg records (gaps, EPIPE), a followed file,
dmesg and journalctl polling through fake binaries, and the fallback order."""

from __future__ import annotations

import errno
import os
import socket
import time
from pathlib import Path

import pytest

from gpuvigil.node.checks.kernel_log import kmsg_stream as ks


def path_with(d: Path) -> dict[str, str]:
    return {"PATH": f"{d}:{os.environ['PATH']}"}


def seqpacket() -> tuple[socket.socket, socket.socket]:
    # SOCK_SEQPACKET keeps record boundaries, like /dev/kmsg: one read, one record.
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def test_dev_kmsg_records_carry_sequence_numbers_and_gaps_are_counted():
    w, r = seqpacket()
    r.setblocking(False)
    health = ks.StreamHealth()
    src = ks.DevKmsg(None, health=health, fd=r.fileno())
    for seq in (1, 2):
        w.send(f"6,{seq},100,-;boot line {seq}\n SUBSYSTEM=pci\n".encode())
    boot = src.read(first=True, wait_s=0.1)
    assert [(x.seq, x.text) for x in boot] == [
        (1, "6,1,100,-;boot line 1"),
        (2, "6,2,100,-;boot line 2"),
    ]
    w.send(b"4,7,200,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    live = src.read(first=False, wait_s=1.0)
    assert [x.seq for x in live] == [7]
    assert health.gaps == 4 and health.gap_events[-1][1] == 4
    assert src.read(first=False, wait_s=0.05) == []
    w.close()
    r.close()


def test_dev_kmsg_epipe_is_survived(monkeypatch):
    w, r = seqpacket()
    r.setblocking(False)
    health = ks.StreamHealth()
    src = ks.DevKmsg(None, health=health, fd=r.fileno())
    w.send(b"6,10,1,-;a\n")
    src.read(first=True, wait_s=0.1)
    real_read, raised = os.read, []

    def flaky(fd, n):
        if not raised:
            raised.append(1)
            raise OSError(errno.EPIPE, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(ks.os, "read", flaky)
    w.send(b"6,50,1,-;after the overrun\n")
    out = src.read(first=False, wait_s=1.0)
    assert [x.seq for x in out] == [50] and health.gaps == 39
    w.close()
    r.close()


def test_followed_file_reads_backlog_then_appended_lines_and_survives_truncation(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] one\n[ 2.0] two\n")
    src = ks.FollowFile(log)
    assert [x.text for x in src.read(first=True, wait_s=0.01)] == ["[ 1.0] one", "[ 2.0] two"]
    assert src.read(first=False, wait_s=0.01) == []
    with log.open("a") as fh:
        fh.write("[ 3.0] thr")  # no newline yet: held back
        fh.flush()
        assert src.read(first=False, wait_s=0.01) == []
        fh.write("ee\n6,9,5,-;a kmsg record\n")
    out = src.read(first=False, wait_s=0.01)
    assert [x.text for x in out] == ["[ 3.0] three", "6,9,5,-;a kmsg record"]
    assert out[1].seq == 9
    log.write_text("[ 0.5] after rotation\n")  # shorter: truncated and rewritten
    assert [x.text for x in src.read(first=False, wait_s=0.01)] == ["[ 0.5] after rotation"]
    src.close()


def test_dmesg_polling_returns_only_new_lines(fake_bin, tmp_path):
    out = tmp_path / "dmesg.out"
    out.write_text("[    1.000000] a\n[    2.000000] b\n")
    fake_bin("dmesg", f"#!/bin/sh\ncat {out}\n")
    src = ks.Dmesg(timeout_s=5, env=path_with(fake_bin.dir))
    assert len(src.read(first=True, wait_s=0)) == 2
    out.write_text("[    1.000000] a\n[    2.000000] b\n[    3.500000] c\n")
    assert [x.text for x in src.read(first=False, wait_s=0)] == ["[    3.500000] c"]


def test_journalctl_polling_follows_its_cursor(fake_bin, tmp_path):
    args = tmp_path / "args"
    fake_bin(
        "journalctl",
        f'#!/bin/sh\necho "$@" >> {args}\n'
        "echo '[    5.000000] host kernel: hello'\necho '-- cursor: s=abc;i=2'\n",
    )
    src = ks.Journalctl(timeout_s=5, env=path_with(fake_bin.dir))
    assert [x.text for x in src.read(first=True, wait_s=0)] == ["[    5.000000] host kernel: hello"]
    src.read(first=False, wait_s=0)
    calls = args.read_text().splitlines()
    assert "-b" in calls[0].split() and "--after-cursor=s=abc;i=2" in calls[1].split()


def test_hanging_poll_tool_is_a_timeout_not_a_hang(fake_bin):
    fake_bin("dmesg", "#!/bin/sh\nsleep 30\n")
    src = ks.Dmesg(timeout_s=0.3, env=path_with(fake_bin.dir))
    with pytest.raises(ks.PollFailed) as e:
        src.read(first=True, wait_s=0)
    assert e.value.finding.code == "CHECK_TIMEOUT"


def test_unreadable_kmsg_falls_back_in_order_and_says_why(fake_bin, tmp_path):
    fake_bin("journalctl", "#!/bin/sh\nexit 0\n")
    health = ks.StreamHealth()
    src = ks.open_source(
        mode="auto",
        kmsg_path=tmp_path / "no-kmsg",
        file=None,
        poll_timeout_s=1,
        env={"PATH": str(fake_bin.dir)},
        health=health,
    )
    assert isinstance(src, ks.Journalctl)
    assert [s for s, _ in health.fallback_from] == [str(tmp_path / "no-kmsg"), "dmesg"]
    health = ks.StreamHealth()
    assert (
        ks.open_source(
            mode="auto",
            kmsg_path=Path("/nonexistent/kmsg"),
            file=None,
            poll_timeout_s=1,
            env={"PATH": ""},
            health=health,
        )
        is None
    )
    assert len(health.fallback_from) == 3


def test_the_real_dev_kmsg_is_read_with_increasing_sequence_numbers():
    kmsg = Path("/dev/kmsg")
    if not os.access(kmsg, os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    health = ks.StreamHealth()
    src = ks.DevKmsg(kmsg, health=health)
    try:
        boot = src.read(first=True, wait_s=0.1)
    finally:
        src.close()
    assert boot, "the ring buffer holds at least the boot banner"
    seqs = [r.seq for r in boot]
    assert all(s is not None for s in seqs) and seqs == sorted(seqs)
    assert all(r.source == "kmsg" and "\n" not in r.text for r in boot)


# --- a followed file that changes under the reader -------------------------------------------

XID = "[ 9.0] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE"


def test_a_file_truncated_and_refilled_within_one_poll_loses_nothing(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] one\n[ 2.0] two\n")
    health = ks.StreamHealth()
    src = ks.FollowFile(log, health=health)
    src.read(first=True, wait_s=0.01)
    assert src.read(first=True, wait_s=0.01) == [] and not src.backlog_left
    # Rewritten in place (same inode), longer than before: size alone cannot tell.
    with log.open("r+b") as fh:
        fh.truncate(0)
        fh.write(f"[ 0.1] new boot\n{XID}\n[ 9.5] and more lines after it\n".encode())
    texts = [r.text for r in src.read(first=False, wait_s=0.01)]
    assert XID in texts and texts[0] == "[ 0.1] new boot"
    assert [why for _, why in health.rewinds] == ["rewritten"]


def test_a_replaced_file_is_read_from_its_start(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] old\n")
    health = ks.StreamHealth()
    src = ks.FollowFile(log, health=health)
    src.read(first=True, wait_s=0.01)
    (tmp_path / "new").write_text(f"{XID}\n")
    os.replace(tmp_path / "new", log)  # logrotate's copy, or a new boot's capture
    assert [r.text for r in src.read(first=False, wait_s=0.01)] == [XID]
    assert [why for _, why in health.rewinds] == ["replaced"]


def test_a_deleted_file_is_a_failure_after_a_grace(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] one\n")
    src = ks.FollowFile(log, missing_grace_s=0.2)
    src.read(first=True, wait_s=0.01)
    log.unlink()
    assert src.read(first=False, wait_s=0.01) == []  # rotation in progress: not yet
    time.sleep(0.25)
    with pytest.raises(ks.PollFailed) as failed:
        src.read(first=False, wait_s=0.01)
    f = failed.value.finding
    assert f.code == "DEPENDENCY_MISSING" and f.status == "FAILED" and "deleted" in f.message
    log.write_text(f"{XID}\n")  # back: read from its start
    assert [r.text for r in src.read(first=False, wait_s=0.01)] == [XID]


def test_a_deleted_file_fails_the_agents_stream_check(tmp_path):
    import threading

    from gpuvigil.node.checks import CheckContext
    from gpuvigil.node.config import NodeConfig
    from gpuvigil.node.kernel_watch import KernelStreamConfig, KernelWatch

    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] one\n")
    ctx = CheckContext(config=NodeConfig(expect_gpus=0), root=tmp_path, env={"PATH": ""})
    cfg = KernelStreamConfig(source="file", file=log, poll_interval_s=0.05)
    w = KernelWatch(cfg, ctx=ctx, changed=threading.Event(), metrics=None)
    w.stream.source.missing_grace_s = 0.2
    w.start()
    try:
        assert w.ready.wait(10)
        log.unlink()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            bad = [f for f in w.snapshot(time.monotonic())[0] if f.status == "FAILED"]
            if bad:
                break
            time.sleep(0.05)
        assert [f.code for f in bad] == ["DEPENDENCY_MISSING"]
    finally:
        w.stop()


def test_the_backlog_is_the_newest_max_bytes_read_in_bounded_batches(tmp_path):
    log = tmp_path / "kern.log"
    old = "[ 0.5] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus."
    filler = "".join(f"[ {i}.0] kernel noise line {i:08d}\n" for i in range(60_000))
    log.write_text(f"{old}\n{filler}{XID}\n")
    src = ks.FollowFile(log, max_bytes=1 << 20)
    batches = []
    while True:
        batch = src.read(first=True, wait_s=0.01)
        batches.append(batch)
        if not src.backlog_left:
            break
    texts = [r.text for b in batches for r in b]
    assert XID in texts and old not in texts  # only the newest max_bytes
    sizes = [sum(len(r.text) + 1 for r in b) for b in batches]
    assert max(sizes) <= ks.BATCH_BYTES + ks.MAX_LINE and len(batches) > 1


def test_reading_a_large_backlog_keeps_memory_flat(tmp_path):
    """Every batch is handed on before the next is read: peak memory is a few batches,
    not the file (tracemalloc counts Python allocations; the bench measures RSS)."""
    import tracemalloc

    log = tmp_path / "kern.log"
    line = "[ 12.345678] some kernel line that is not an Xid at all, padded to 100 bytes ...\n"
    with log.open("w") as fh:
        for _ in range(20):
            fh.write(line * 8000)  # ~14 MB
    src = ks.FollowFile(log)
    tracemalloc.start()
    try:
        n = 0
        while True:
            n += len(src.read(first=True, wait_s=0.01))
            if not src.backlog_left:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 160_000
    assert peak < 8 * (1 << 20) < log.stat().st_size // 1.5, peak
