"""The kernel_log check: sources, fallback with SOURCE_FALLBACK, and every fail-closed path."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuvigil.core.findings import Status
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading
from gpuvigil.node.checks.kernel_log import kernel_log
from gpuvigil.node.config import KernelLogConfig, NodeConfig

NOW = datetime.now(UTC)
CAT, SLEEP = shutil.which("cat"), shutil.which("sleep")  # the fake PATH has only fakes
BOOT = "0f0e0d0c-0000-4000-8000-000000000001"
ISO = NOW.strftime("%Y-%m-%dT%H:%M:%S")

DMESG_OK = "".join(
    f"{ISO},{us}+00:00 {text}\n"
    for us, text in (
        ("100000", "pci 0000:3b:00.0: enabling device (0000 -> 0003)"),
        ("200000", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5 2024"),
        (
            "300000",
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        ),
        (
            "400000",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 10 LTSSM Fault Up",
        ),
    )
)
JOURNAL_OK = (
    f"{ISO}.500000+00:00 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', "
    "name=<unknown>, An uncorrectable double bit error (DBE) has been detected.\n"
)
KMSG_OK = (
    "6,501,120000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
    "4,502,130000000,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=77, name=train, Graphics SM Warp "
    "Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:3b:00.0\n"
    "6,503,140000000,-;usb 1-1: new device\n"
)


def script(body: str) -> str:
    return f"#!/bin/sh\n{body}\n"


def cat_script(text: str, tmp_path: Path, name: str) -> str:
    out = tmp_path / f"{name}.out"
    out.write_text(text)
    return script(f'{CAT} "{out}"')


@pytest.fixture
def btime() -> int:
    # booted ~17 min before the test runs, not before collection: KMSG_OK's Xid 13 stays
    # visible for its 1 h window, and a suite past 45 min aged a collection-time boot out of it
    return int(datetime.now(UTC).timestamp()) - 1000


@pytest.fixture
def root(tmp_path: Path, btime: int) -> Path:
    r = tmp_path / "root"
    (r / "proc/sys/kernel/random").mkdir(parents=True)
    (r / "proc/sys/kernel/random/boot_id").write_text(BOOT + "\n")
    (r / "proc/stat").write_text(f"cpu  1 2 3\nbtime {btime}\nprocesses 9\n")
    (r / "dev").mkdir()
    return r


def ctx_for(root: Path, fake_bin, **cfg) -> CheckContext:
    cfg.setdefault("timeout_s", 2)
    node = NodeConfig(kernel_log=KernelLogConfig(**cfg))
    return CheckContext(config=node, root=root, env={"PATH": str(fake_bin.dir)})


def run(ctx):
    findings, run_ = run_check(REGISTRY["kernel_log"], ctx)
    return findings, run_


def codes(findings):
    return sorted((f.code, f.component, f.status.value) for f in findings)


def test_registered_as_fast():
    spec = REGISTRY["kernel_log"]
    assert spec.group == "fast" and spec.timeout_s >= 30


def test_kmsg_first(root, fake_bin, btime):
    (root / "dev/kmsg").write_text(KMSG_OK)
    findings, _ = run(ctx_for(root, fake_bin))
    assert codes(findings) == [("XID_13", "pci:0000:3b:00.0", "WARNING")]
    (f,) = findings
    assert f.evidence["sources"] == ["kmsg"]
    # wall time = boot time + usec from the record
    assert f.evidence["first_seen_at"] == datetime.fromtimestamp(btime + 130, UTC).isoformat()


def test_kmsg_driver_load_clears_reset_class_events(root, fake_bin):
    rec = "4,600,100000000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=a, DBE\n"
    load = "6,601,200000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15\n"
    (root / "dev/kmsg").write_text(rec + load)
    findings, _ = run(ctx_for(root, fake_bin))
    assert findings == []
    (root / "dev/kmsg").write_text(load + rec.replace("100000000", "300000000"))
    findings, _ = run(ctx_for(root, fake_bin))
    assert codes(findings) == [("XID_48", "pci:0000:3b:00.0", "FAILED")]


def hopper(index: int, bus: str) -> GpuInventory:
    gpu = GpuReading(index=index, pci_bus_id=bus, architecture="Hopper")
    return GpuInventory("nvml", datetime.now(UTC), gpus=(gpu,))


def test_gpu_map_from_the_gpu_inventory_fact(root, fake_bin):
    (root / "dev/kmsg").write_text(KMSG_OK)
    ctx = ctx_for(root, fake_bin)
    ctx.facts.put(hopper(5, "00000000:3B:00.0"))  # what the `gpu` check leaves
    findings, _ = run(ctx)
    assert codes(findings) == [("XID_13", "gpu:5", "WARNING")]


def test_dmesg_when_kmsg_is_missing(root, fake_bin, tmp_path):
    fake_bin("dmesg", cat_script(DMESG_OK, tmp_path, "dmesg"))
    findings, r = run(ctx_for(root, fake_bin))
    got = codes(findings)
    assert ("XID_79", "pci:0000:3b:00.0", "FAILED") in got
    assert ("SXID_20034", "nvswitch:0", "FAILED") in got
    fb = next(f for f in findings if f.code == "SOURCE_FALLBACK")
    assert fb.status is Status.WARNING
    assert "kmsg" in fb.message and "DEPENDENCY_MISSING" in fb.message
    assert fb.evidence["used"] == "dmesg"
    assert r.status is Status.FAILED  # the Xid 79


def test_explicit_order_and_journal(root, fake_bin, tmp_path):
    fake_bin("journalctl", cat_script(JOURNAL_OK, tmp_path, "journal"))
    findings, _ = run(ctx_for(root, fake_bin, sources=["journal", "dmesg"]))
    assert codes(findings) == [("XID_48", "pci:0000:3b:00.0", "FAILED")]


def test_configured_file(root, fake_bin):
    (root / "var/log").mkdir(parents=True)
    (root / "var/log/kern.log").write_text(
        "Nov 30 07:31:02 gpu-7 kernel: [  12.0] NVRM: Xid (PCI:0000:3b:00): 31, pid=1, "
        "name=a, MMU Fault\n"
    )
    findings, _ = run(ctx_for(root, fake_bin, file="/var/log/kern.log"))
    assert [f.code for f in findings] in ([], ["XID_31"])  # 31 expires after its window
    assert all(f.code != "SOURCE_FALLBACK" for f in findings)


def test_configured_file_time_zone(root, fake_bin):
    (root / "k.log").write_text(
        "[Mon Nov 30 09:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, gone\n"
    )
    ctx = ctx_for(root, fake_bin, file="k.log", timezone="Asia/Tokyo")
    log, _ = kernel_log.read_kernel_log(ctx, cfg=ctx.config.kernel_log, now=NOW)
    assert log.events[0].time == datetime(2026, 11, 30, 0, 0, tzinfo=UTC)


def test_unknown_time_zone_is_a_config_error():
    with pytest.raises(ValueError, match="unknown time zone"):
        KernelLogConfig(timezone="Mars/Olympus")


def test_configured_file_missing_fails_closed(root, fake_bin):
    findings, _ = run(ctx_for(root, fake_bin, file="/var/log/nope.log"))
    assert codes(findings) == [("DEPENDENCY_MISSING", "source:file", "FAILED")]


def test_file_tail_is_bounded(root, fake_bin):
    line = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, gone\n"
    (root / "k.log").write_text("x" * 10000 + "\n" + "noise\n" * 1000 + line)
    findings, _ = run(ctx_for(root, fake_bin, file="k.log", max_bytes=4096))
    assert [f.code for f in findings] == ["XID_79"]


# --- every source broken in every way --------------------------------------------------------

BROKEN = {
    "missing": None,
    "hang": script(f"{SLEEP} 30"),
    "hang_child": script(f"({SLEEP} 30; echo late) &\n{SLEEP} 30"),
    "crash": script("echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1"),
    "garbage": script("printf '\\377\\376 not a log at all\\n%.0s' 1 2 3"),
    "killed": script("kill -SEGV $$"),
}
WANT = {
    "missing": "DEPENDENCY_MISSING",
    "hang": "CHECK_TIMEOUT",
    "hang_child": "CHECK_TIMEOUT",
    "crash": "CHECK_ERROR",
    "garbage": "CHECK_ERROR",
    "killed": "CHECK_ERROR",
}


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_all_sources_broken_fails_closed(root, fake_bin, how):
    if BROKEN[how] is not None:
        fake_bin("dmesg", BROKEN[how])
        fake_bin("journalctl", BROKEN[how])
    (root / "dev/kmsg").write_bytes(b"\x00\x01 garbage, not records\n")
    findings, r = run(ctx_for(root, fake_bin, timeout_s=0.5))
    assert r.status is Status.FAILED
    assert codes(findings) == sorted(
        [
            ("CHECK_ERROR", "source:kmsg", "FAILED"),
            (WANT[how], "source:dmesg", "FAILED"),
            (WANT[how], "source:journal", "FAILED"),
        ]
    )
    assert all(f.could_not_run for f in findings)


@pytest.mark.parametrize("how", sorted(BROKEN))
def test_a_broken_tool_falls_back(root, fake_bin, tmp_path, how):
    if BROKEN[how] is not None:
        fake_bin("dmesg", BROKEN[how])
    fake_bin("journalctl", cat_script(JOURNAL_OK, tmp_path, "journal"))
    findings, _ = run(ctx_for(root, fake_bin, sources=["dmesg", "journal"], timeout_s=0.5))
    assert [f.code for f in findings] == ["XID_48", "SOURCE_FALLBACK"]
    assert findings[1].evidence["broken"][0]["code"] == WANT[how]


def test_kmsg_empty_or_unreadable_falls_back(root, fake_bin, tmp_path):
    fake_bin("dmesg", cat_script(DMESG_OK, tmp_path, "dmesg"))
    (root / "dev/kmsg").write_text("")
    findings, _ = run(ctx_for(root, fake_bin))
    fb = next(f for f in findings if f.code == "SOURCE_FALLBACK")
    assert "no records" in fb.message
    if os.geteuid() != 0:  # root reads a 000 file anyway
        (root / "dev/kmsg").write_text(KMSG_OK)
        (root / "dev/kmsg").chmod(0)
        findings, _ = run(ctx_for(root, fake_bin))
        assert any(f.code == "SOURCE_FALLBACK" for f in findings)


def test_truncated_tool_output_is_not_a_read(root, fake_bin, tmp_path):
    big = DMESG_OK * 200
    fake_bin("dmesg", cat_script(big, tmp_path, "dmesg"))
    findings, _ = run(ctx_for(root, fake_bin, sources=["dmesg"], max_bytes=4096))
    assert codes(findings) == [("CHECK_ERROR", "source:dmesg", "FAILED")]
    assert "more than 4096 bytes" in findings[0].message


def test_empty_tool_output_is_not_a_clean_read(root, fake_bin, tmp_path):
    # A container's journal without the kernel log, or dmesg after `dmesg -C`: silence is
    # not "no Xid", so the next source is read.
    fake_bin("dmesg", script("exit 0"))
    fake_bin("journalctl", cat_script(JOURNAL_OK, tmp_path, "journal"))
    findings, r = run(ctx_for(root, fake_bin, sources=["dmesg", "journal"]))
    assert [f.code for f in findings] == ["XID_48", "SOURCE_FALLBACK"]
    assert "no kernel messages" in findings[1].message
    fake_bin("journalctl", script("exit 0"))
    findings, r = run(ctx_for(root, fake_bin, sources=["dmesg", "journal"]))
    assert r.status is Status.FAILED and all(f.could_not_run for f in findings)


def test_real_dev_kmsg_reads_without_blocking():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    ctx = CheckContext(config=NodeConfig(kernel_log=KernelLogConfig(sources=["kmsg"])))
    log, failures = kernel_log.read_kernel_log(
        ctx, cfg=ctx.config.kernel_log, now=datetime.now(UTC)
    )
    assert failures == [] and log is not None
    assert log.source == "kmsg" and log.lines_read > 0 and log.boot_id


def test_analyze_capture_judges_as_of_the_capture_end():
    cap = (
        b"2025-01-21T02:00:00,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, x\n"
        b"2025-01-21T02:10:00,000000+00:00 NVRM: Xid (PCI:0000:1b:00): 48, pid=1, name=a, DBE\n"
        b"2025-01-21T02:30:00,000000+00:00 usb 1-1: last line of the capture\n"
    )
    got = kernel_log.analyze_capture(cap)
    assert [(f.code, f.status.value) for f in got] == [("XID_48", "FAILED"), ("XID_13", "WARNING")]
    later = datetime(2025, 1, 21, 4, 0, tzinfo=UTC)  # Xid 13's hour has passed
    assert [f.code for f in kernel_log.analyze_capture(cap, now=later)] == ["XID_48"]
    inv = hopper(2, "00000000:1B:00.0")
    assert kernel_log.analyze_capture(cap, gpus=inv.gpu_map())[0].component == "gpu:2"


def test_analyze_capture_of_the_corpus(corpus):
    data = (corpus / "kernel_logs" / "xid79_sxid20034_hgx_gpud-sxid-readme.log").read_bytes()
    got = {(f.code, f.component, f.action.value) for f in kernel_log.analyze_capture(data)}
    assert got == {
        ("XID_79", "pci:0000:91:00.0", "REBOOT"),
        ("SXID_20034", "nvswitch:0", "REBOOT"),
        ("SXID_20034", "nvswitch:1", "REBOOT"),
        ("SXID_20034", "nvswitch:2", "REBOOT"),
    }


def test_analyze_capture_of_a_syslog_file_takes_the_year():
    cap = (
        b"Nov 30 07:31:02 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, x\n"
        b"Nov 30 07:40:00 gpu-7 kernel: eth0: link up\n"
    )
    cfg = KernelLogConfig(timezone="UTC")
    (f,) = kernel_log.analyze_capture(cap, cfg=cfg, year=2024)
    assert f.evidence["first_seen_at"] == "2024-11-30T07:31:02+00:00"
    assert f.status is Status.WARNING  # judged as of 07:40 that day: inside its hour
