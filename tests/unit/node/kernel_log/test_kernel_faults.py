"""Kernel failures without an Xid, the Talos prefix, and captures that are not kernel logs.

Lines follow the forms people posted (cited per test); the wording is the driver's own.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuvigil.core.findings import NodeReport
from gpuvigil.node.checks.gpu.readings import GpuRef, gpu_map
from gpuvigil.node.checks.kernel_log import kernel_log


def found(data: bytes, **kw) -> list[tuple[str, str]]:
    return sorted((f.code, f.component) for f in kernel_log.analyze_capture(data, **kw))


def exit_code(data: bytes) -> int:
    return NodeReport(node="n", findings=tuple(kernel_log.analyze_capture(data))).exit_code()


def test_fallen_off_at_probe_time_over_three_lines() -> None:
    # The form quoted in https://github.com/NVIDIA/NVSentinel/issues/155 (driver 570.158.01):
    # the bus id is on the first line only, and the driver-load line comes after.
    data = (
        b"[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        b"               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        b"               NVRM: fallen off the bus and is not responding to commands.\n"
        b"[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n"
        b"[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01"
        b"  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025\n"
    )
    assert found(data) == [
        ("GPU_INIT_FAILED", "pci:0000:b3:00.0"),
        ("GPU_LOST", "pci:0000:b3:00.0"),
    ]
    gpus = gpu_map([GpuRef(index=4, bus_id="0000:b3:00.0")])
    assert ("GPU_LOST", "gpu:4") in found(data, gpus=gpus)
    assert exit_code(data) == 1


def test_rm_init_adapter_failed() -> None:
    # The lines of https://github.com/Cyridd/cmpunlocker/issues/4 (repeated on each retry).
    data = b"".join(
        b"[   %d.091872] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:894)\n"
        b"[   %d.092238] NVRM: GPU 0000:01:00.0: rm_init_adapter failed, device minor number 0\n"
        % (t, t)
        for t in (21, 37)
    )
    got = kernel_log.analyze_capture(data)
    assert [(f.code, f.component, f.fatal) for f in got] == [
        ("GPU_INIT_FAILED", "pci:0000:01:00.0", True)
    ]
    assert got[0].evidence["count"] == 4


def test_xorgs_failed_to_initialize_relayed_to_the_journal() -> None:
    # The journal line of https://github.com/Bumblebee-Project/Bumblebee/issues/550: Xorg's
    # bus form (PCI:1:0:0) is no PCI id, so the node carries it.
    data = (
        b"Mar 05 23:33:35 ivosung bumblebeed[1734]: [91063.874832] [ERROR][XORG] (EE) "
        b"NVIDIA(GPU-0): Failed to initialize the NVIDIA GPU at PCI:1:0:0.  Please\n"
    )
    assert found(data) == [("GPU_INIT_FAILED", "node")]
    assert exit_code(data) == 1


def test_the_gsp_timeout_banner_without_its_xid_line_is_xid_119() -> None:
    # The lines of https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230 (595.71.05).
    data = (
        b"[   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs"
        b" 812751949 heartbeat 1899482 heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200\n"
        b"[   84.300488] NVRM: GPU6 _kgspLogRpcTimeout: ****************** GSP Timeout"
        b" ******************\n"
    )
    got = kernel_log.analyze_capture(data)
    assert [(f.code, f.component, f.fatal) for f in got] == [("XID_119", "node", True)]
    assert got[0].evidence["count"] == 2
    # With its Xid line the Xid rules' finding is the one (no second XID_119 on the node).
    xid = (
        b"[   84.300500] NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout"
        b" after 45s of waiting for RPC response from GPU4 GSP! Expected function 76\n"
    )
    assert [c for c, _ in found(data + xid)] == ["XID_119"]
    assert ("XID_119", "node") not in found(data + xid)


def test_old_and_journal_forms_of_fallen_off_the_bus() -> None:
    # https://github.com/Bumblebee-Project/Bumblebee/issues/554 ("GPU at 0000:01:00.0 has
    # fallen off the bus.") and the journal prefix of https://github.com/pop-os/pop/issues/3363.
    old = b"[   49.261458] NVRM: GPU at 0000:01:00.0 has fallen off the bus.\n"
    journal = b"Apr 29 19:24:11 EVE kernel: NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.\n"
    for data in (old, journal):
        assert found(data) == [("GPU_LOST", "pci:0000:01:00.0")], data


def test_a_probe_failure_by_the_pci_core() -> None:
    data = b"[    5.1] nvidia 0000:41:00.0: probe with driver nvidia failed with error -1\n"
    assert found(data) == [("GPU_INIT_FAILED", "pci:0000:41:00.0")]


def test_nvlink_training_failure_outside_an_xid_line() -> None:
    # The driver's message (NVIDIA/open-gpu-kernel-modules
    # src/nvidia/src/kernel/gpu/nvlink/arch/hopper/kernel_nvlink_gh100.c, ALI training);
    # printed as an Xid it is the Xid rules' (one event, one finding).
    plain = b"[  88.1] NVRM: GPU 0000:18:00.0: NVLink: Link training failed for link 7\n"
    assert found(plain) == [("NVLINK_DOWN", "pci:0000:18:00.0")]
    as_xid = b"[  88.1] NVRM: Xid (PCI:0000:18:00): 144, NVLink: Link training failed for link 7\n"
    assert "NVLINK_DOWN" not in {c for c, _ in found(as_xid)}


def test_a_reboot_in_the_log_ends_them() -> None:
    before = b"[   49.2] NVRM: GPU at 0000:01:00.0 has fallen off the bus.\n"
    boot = b"[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02) (gcc 13.2.0) #45\n"
    assert found(before + boot + b"[    1.0] pci 0000:01:00.0: [10de:2330]\n") == []
    assert found(boot + before) == [("GPU_LOST", "pci:0000:01:00.0")]


def test_talos_prefix_gives_the_time_so_a_sympathetic_xid_45_is_suppressed() -> None:
    # talosctl dmesg: "<node>: kern:    warn: [RFC3339 with nanoseconds]: <message>"
    data = (
        b"172.20.0.2: kern:    warn: [2026-11-30T07:31:02.123456789Z]: NVRM: Xid "
        b"(PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        b"172.20.0.2: kern:    warn: [2026-11-30T07:31:03.000000001Z]: NVRM: Xid "
        b"(PCI:0000:3b:00): 45, pid=77, name=python, Ch 00000010\n"
    )
    got = kernel_log.analyze_capture(data)
    assert [f.code for f in got] == ["XID_79"]
    assert got[0].observed_at == datetime(2026, 11, 30, 7, 31, 2, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"\n\n   \n", "empty"),
        (bytes(range(256)) * 64, "not text"),
        ("[    1.0] NVRM: Xid (PCI:0000:3b:00): 79, x\n".encode("utf-16"), "not text"),
        (b"hello world\nthis is a shopping list\n", "not a kernel log"),
    ],
    ids=["empty", "blank", "binary", "utf16-undecoded", "prose"],
)
def test_what_is_not_a_kernel_log_is_could_not_tell(data: bytes, why: str) -> None:
    got = kernel_log.analyze_capture(data)
    assert [f.code for f in got] == ["CHECK_ERROR"] and why in got[0].message
    assert exit_code(data) == 2


def test_a_quiet_kernel_log_is_healthy() -> None:
    data = b"[    0.000000] Linux version 6.1.0\n[    1.2] usb 1-1: new device\n"
    assert found(data) == [] and exit_code(data) == 0
