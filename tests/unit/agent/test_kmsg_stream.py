"""The kernel-log stream sources: /dev/kmsg records (gaps, EPIPE), a followed file,
dmesg and journalctl polling through fake binaries, and the fallback order."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from gpuvigil.node.probes import kmsg_stream as ks


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
    assert [(x.seq, x.text) for x in boot] == [(1, "6,1,100,-;boot line 1"),
                                               (2, "6,2,100,-;boot line 2")]
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
    fake_bin("journalctl", f"#!/bin/sh\necho \"$@\" >> {args}\n"
             "echo '[    5.000000] host kernel: hello'\necho '-- cursor: s=abc;i=2'\n")
    src = ks.Journalctl(timeout_s=5, env=path_with(fake_bin.dir))
    assert [x.text for x in src.read(first=True, wait_s=0)] == [
        "[    5.000000] host kernel: hello"]
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
    src = ks.open_source(mode="auto", kmsg_path=tmp_path / "no-kmsg", file=None,
                         poll_timeout_s=1, env={"PATH": str(fake_bin.dir)}, health=health)
    assert isinstance(src, ks.Journalctl)
    assert [s for s, _ in health.fallback_from] == [str(tmp_path / "no-kmsg"), "dmesg"]
    health = ks.StreamHealth()
    assert ks.open_source(mode="auto", kmsg_path=Path("/nonexistent/kmsg"), file=None,
                          poll_timeout_s=1, env={"PATH": ""}, health=health) is None
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
