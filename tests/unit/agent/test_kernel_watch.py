"""What the kernel-log stream says about itself: gaps, staleness, no source at all."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpuvigil.core.findings import Status
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.kernel_watch import KernelStreamConfig, KernelWatch


def watch(tmp_path: Path, **cfg) -> KernelWatch:
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] boot\n")
    config = KernelStreamConfig(**{"source": "file", "file": log, **cfg})
    ctx = CheckContext(config=NodeConfig(expect_gpus=0), root=tmp_path, env={"PATH": ""})
    return KernelWatch(config, ctx=ctx, changed=threading.Event(), metrics=None)


def test_recent_gap_is_a_warning_that_expires(tmp_path):
    w = watch(tmp_path, gap_hold_s=60)
    now = time.monotonic()
    w.health.gap_events.append((now - 10, 7))
    w.health.gaps = 7
    findings, runs = w.snapshot(now)
    (gap,) = [f for f in findings if f.code == "KMSG_GAP"]
    assert gap.status is Status.WARNING and gap.evidence["lost"] == 7
    assert runs[0].check == "kernel_log"
    assert not [f for f in w.snapshot(now + 120)[0] if f.code == "KMSG_GAP"]


def test_a_reader_that_stopped_reading_is_stale(tmp_path):
    w = watch(tmp_path, poll_interval_s=0.5, poll_timeout_s=1.0)
    now = time.monotonic()
    w.health.alive_at = now - 10  # limit: 2 x (0.5 + 1.0) = 3 s
    (stale,) = [f for f in w.snapshot(now)[0] if f.code == "RESULT_STALE"]
    assert stale.status is Status.FAILED


def test_no_source_at_all_fails_closed(tmp_path):
    config = KernelStreamConfig(source="auto", kmsg_path=tmp_path / "none")
    ctx = CheckContext(config=NodeConfig(expect_gpus=0), root=tmp_path, env={"PATH": ""})
    w = KernelWatch(config, ctx=ctx, changed=threading.Event(), metrics=None)
    (f,) = w.snapshot(time.monotonic())[0]
    assert f.code == "DEPENDENCY_MISSING" and f.status is Status.FAILED
    assert "dmesg" in f.message and "journal" in f.message
