"""`nvidia-smi -q -x`: the real corpus (ground truth in its MANIFEST), our own fixtures in the
real format, garbage (hypothesis), and the fake binary's fail-closed paths."""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import Status, utcnow
from gpuvigil.fakes import faults, gpu
from gpuvigil.fakes import nvidia_smi as fake_smi
from gpuvigil.fakes.faults import Fault
from gpuvigil.node.catalog import gpus as catalog
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.gpu import nvidia_smi
from gpuvigil.node.checks.gpu.rules import gpu as rules
from gpuvigil.node.config import GpuConfig, NodeConfig


def judge(inv, **kw):
    return rules.judge_inventory(inv, cfg=GpuConfig(), catalog=catalog.load(), now=utcnow(), **kw)


def manifest(corpus: Path) -> dict[str, dict[str, str]]:
    with (corpus / "nvidia_smi" / "MANIFEST.tsv").open() as f:
        return {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}


def test_corpus_xml_matches_ground_truth(corpus: Path) -> None:
    rows = manifest(corpus)
    xmls = sorted((corpus / "nvidia_smi").glob("x_*.xml"))
    assert len(xmls) >= 10
    for path in xmls:
        inv = nvidia_smi.parse_xml(path.read_bytes())
        truth = rows[path.name]
        findings = judge(inv)
        failed = [f.code for f in findings if f.status is Status.FAILED]
        assert inv.gpus, path.name
        assert truth["gpu_model"].startswith(inv.gpus[0].name), path.name
        if "only 1 <gpu> element" in truth["gpu_count"]:
            # attached_gpus=4 but one block: never "4 healthy GPUs", a failed parse instead.
            assert failed == ["CHECK_ERROR"], path.name
        else:
            assert failed == [], (path.name, failed)
            if truth["gpu_count"].isdigit():
                assert len(inv.gpus) == int(truth["gpu_count"]), path.name


def test_corpus_specifics(corpus: Path) -> None:
    d = corpus / "nvidia_smi"
    a100 = nvidia_smi.parse_xml((d / "x_a100-sxm4-v12_telegraf.xml").read_bytes()).gpus[0]
    assert a100.ecc_enabled is True and a100.ecc_volatile_uncorrected == 0
    assert a100.remap_pending is None  # <remapped_rows>N/A</remapped_rows>
    assert a100.slowdown_temp_c == 89 and a100.memory_max_temp_c == 95
    a10g = nvidia_smi.parse_xml((d / "x_a10g_telegraf.xml").read_bytes()).gpus[0]
    assert a10g.clock_event_reasons == 0x1  # old clocks_throttle_reasons names
    assert a10g.remap_pending is False and a10g.remap_failure is False
    t4 = nvidia_smi.parse_xml((d / "x_tesla-t4_telegraf.xml").read_bytes()).gpus[0]
    assert (t4.retired_sbe, t4.retired_dbe, t4.retired_pending) == (0, 0, False)
    bw = (d / "x_pro-6000-maxq-blackwell-v13_telegraf.xml").read_bytes()
    g = nvidia_smi.parse_xml(bw).gpus[0]
    assert g.architecture == "Blackwell" and g.ecc_enabled is False
    assert g.slowdown_temp_c is None  # relative "tlimit" thresholds are not absolute limits
    r3060 = nvidia_smi.parse_xml((d / "x_rtx-3060-v12_telegraf.xml").read_bytes()).gpus[0]
    assert r3060.recovery_action == "NONE"  # reset status "deprecated", recovery "None"
    assert a100.recovery_action == "NONE"  # gpu_reset_status No/No
    r3090 = nvidia_smi.parse_xml((d / "x_3090-v13_telegraf.xml").read_bytes()).gpus[0]
    assert r3090.clock_event_reasons == 0x4  # SW power cap only: not a finding


def parse_node(node: gpu.FakeNode):
    return nvidia_smi.parse_xml(fake_smi.lost_lines(node) + fake_smi.render_xml(node))


@pytest.mark.parametrize(
    ("fault", "codes"),
    [
        (Fault.ECC_UNCORRECTABLE, {"ECC_UNCORRECTED_VOLATILE", "ROW_REMAP_PENDING"}),
        (Fault.ROW_REMAP_FAILURE, {"ROW_REMAP_FAILURE"}),
        (Fault.POWER_BRAKE, {"POWER_BRAKE"}),
        (Fault.HW_SLOWDOWN, {"HW_SLOWDOWN"}),
        (Fault.THERMAL_SLOWDOWN, {"THERMAL_SLOWDOWN"}),
        (Fault.PCIE_DEGRADED, {"PCIE_DEGRADED"}),
        (Fault.GPU_OFF_BUS, {"GPU_LOST"}),
    ],
)
def test_own_fixtures_in_the_real_format(fault, codes) -> None:
    node = faults.apply(gpu.make_node(8), fault, gpu=2)
    inv = parse_node(node)
    assert len(inv.gpus) == 8 and inv.count == 8
    found = {f.code: f for f in judge(inv, expect=8)}
    assert codes <= set(found)
    lost_bus = node.gpus[2].pci_bus_id
    assert all(
        found[c].component == "gpu:2" or found[c].evidence.get("pci_bus_id") == lost_bus
        for c in codes
    )


def test_healthy_fixture_is_clean() -> None:
    assert judge(parse_node(gpu.make_node(8)), expect=8) == []


def test_volta_page_retirement() -> None:
    node = gpu.make_node(8, model="V100")
    faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=1)
    node.gpus[4].retired_sbe = list(range(70))
    codes = {(f.code, f.component) for f in judge(parse_node(node))}
    assert ("RETIRED_PAGES_PENDING", "gpu:1") in codes
    assert ("RETIRED_PAGES_LIMIT", "gpu:4") in codes


def test_truncated_output_is_not_healthy() -> None:
    xml = fake_smi.render_xml(gpu.make_node(8))
    inv = nvidia_smi.parse_xml(xml[: len(xml) // 2])
    assert [f.code for f in judge(inv, expect=8)] == ["CHECK_ERROR"]


def test_fewer_gpu_blocks_than_attached_is_an_error() -> None:
    xml = fake_smi.render_xml(gpu.make_node(8))
    second = xml.index("\t<gpu id", xml.index("\t<gpu id") + 5)
    cut = xml[:second] + "</nvidia_smi_log>\n"
    inv = nvidia_smi.parse_xml(cut)
    assert len(inv.gpus) == 1 and inv.count == 8
    assert "CHECK_ERROR" in {f.code for f in judge(inv)}


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=2000), st.text(max_size=2000)))
def test_garbage_never_raises(data) -> None:
    inv = nvidia_smi.parse_xml(data)
    judge(inv, expect=8)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=20000), st.text(max_size=50))
def test_mangled_real_output_never_raises(cut, junk) -> None:
    xml = fake_smi.render_xml(faults.apply(gpu.make_node(4), Fault.POWER_BRAKE, gpu=1))
    inv = nvidia_smi.parse_xml(xml[:cut] + junk + xml[cut:])
    judge(inv, expect=4)


# --- The binary, fail closed -----------------------------------------------------------------
def ctx_with(path: str) -> CheckContext:
    return CheckContext(config=NodeConfig(), env={**os.environ, "PATH": path})


def test_binary_prints_captured_output(fake_bin, tmp_path) -> None:
    out = tmp_path / "q.xml"
    out.write_text(fake_smi.render_xml(gpu.make_node(8)))
    fake_bin("nvidia-smi", f"#!/bin/sh\ncat {out}\n")
    inv, failure = nvidia_smi.collect(ctx_with(f"{fake_bin.dir}:/usr/bin:/bin"), timeout_s=10)
    assert failure is None and inv is not None and len(inv.gpus) == 8


def test_binary_lost_gpu_exit_nonzero_still_read(fake_bin, tmp_path) -> None:
    node = faults.apply(gpu.make_node(8), Fault.GPU_OFF_BUS, gpu=3)
    out = tmp_path / "q.xml"
    out.write_text(fake_smi.render_xml(node))
    err = tmp_path / "err"
    err.write_text(fake_smi.lost_lines(node))
    fake_bin("nvidia-smi", f"#!/bin/sh\ncat {err} >&2\ncat {out}\nexit 15\n")
    inv, failure = nvidia_smi.collect(ctx_with(f"{fake_bin.dir}:/usr/bin:/bin"), timeout_s=10)
    assert failure is None and inv is not None
    assert [g.pci_bus_id for g in inv.gpus if g.lost] == [node.gpus[3].pci_bus_id]


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ("#!/bin/sh\nsleep 60\n", "CHECK_TIMEOUT"),
        ("#!/bin/sh\nsleep 60 &\nwait\n", "CHECK_TIMEOUT"),
        ("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n", "CHECK_ERROR"),
        ("#!/bin/sh\nkill -SEGV $$\n", "CHECK_ERROR"),
        ("#!/bin/sh\necho 'not xml at all'\n", "CHECK_ERROR"),
        ("#!/bin/sh\nhead -c 100000000 /dev/zero | tr '\\0' x\n", "CHECK_ERROR"),
    ],
    ids=["hang", "hanging-child", "exit-9", "crash", "garbage", "100MB"],
)
def test_binary_fail_closed(fake_bin, script, code) -> None:
    fake_bin("nvidia-smi", script)
    t0 = time.monotonic()
    inv, failure = nvidia_smi.collect(ctx_with(f"{fake_bin.dir}:/usr/bin:/bin"), timeout_s=2)
    assert time.monotonic() - t0 < 20
    assert inv is None and failure is not None and failure.code == code


def test_binary_missing(fake_bin) -> None:
    inv, failure = nvidia_smi.collect(ctx_with(str(fake_bin.dir)), timeout_s=2)
    assert inv is None and failure is not None and failure.code == "DEPENDENCY_MISSING"


# --- `nvidia-smi -q` text, as pasted into tickets ---------------------------------------------
def test_corpus_text_matches_ground_truth(corpus: Path) -> None:
    d = corpus / "nvidia_smi"

    def found(name: str) -> set[tuple[str, str, str]]:
        inv = nvidia_smi.parse_xml((d / name).read_text())
        return {(f.status.value, f.code, f.component) for f in judge(inv)}

    # HW Slowdown + HW Power Brake active on all 8: one POWER_BRAKE each, no vaguer duplicate.
    brake = found("q_h100x8_535.161.08_hw-power-brake_gpud.txt")
    assert brake == {("FAILED", "POWER_BRAKE", f"gpu:{i}") for i in range(8)}
    # GPU 00000000:75:00.0 (index 2 in bus order): power brake and SW thermal, parent off.
    assert found("q_h100x8_535.183.01_gpud.txt") == {
        ("FAILED", "POWER_BRAKE", "gpu:2"),
        ("WARNING", "THERMAL_SLOWDOWN", "gpu:2"),
    }
    assert found("q_a10_535.129.03_remap-pending_gpud.txt") == {
        ("FAILED", "ROW_REMAP_PENDING", "gpu:0")
    }
    # Truncated at 1 of 8 GPUs: never "8 healthy GPUs".
    assert found("q_h100_535.183.01_truncated-edited_gpud-invalid.txt") == {
        ("FAILED", "CHECK_ERROR", "node")
    }
    assert found("q_rtx4090x8_535.154.05_gpud.txt") == set()
    assert found("q_titanv_560.35.03_gpud.txt") == set()
    a10 = nvidia_smi.parse_xml((d / "q_a10_535.129.03_remap-pending_gpud.txt").read_text())
    g = a10.gpus[0]
    assert (g.remap_uncorrected, g.remap_pending, g.remap_failure) == (4, True, False)
    assert g.uuid == "GPU-73d12ef7-f589-f867-4259-c7090ab44736"


def test_text_and_xml_agree_on_our_fixture() -> None:
    """The -q text of a node read through the text path equals its -q -x reading."""
    node = faults.apply(gpu.make_node(4), Fault.ECC_UNCORRECTABLE, gpu=1)
    xml_inv = parse_node(node)
    text = TEXT_OF_GPU1
    text_inv = nvidia_smi.parse_xml(text)
    g_xml, g_text = xml_inv.gpus[1], text_inv.gpus[0]
    for field in ("ecc_volatile_uncorrected", "remap_uncorrected", "remap_pending"):
        assert getattr(g_xml, field) == getattr(g_text, field), field


TEXT_OF_GPU1 = """
==============NVSMI LOG==============

Timestamp                                 : Mon Nov 30 07:00:00 2026
Driver Version                            : 550.90.07

Attached GPUs                             : 1
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    ECC Mode
        Current                           : Enabled
        Pending                           : Enabled
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 0
            SRAM Uncorrectable SEC-DED    : 0
            DRAM Correctable              : 0
            DRAM Uncorrectable            : 1
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 1
        Pending                           : Yes
        Remapping Failure Occurred        : No
"""


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" :\nGPU0123456789ABCDEF.abcxyz=")), max_size=800))
def test_text_garbage_never_raises(data) -> None:
    judge(nvidia_smi.parse_xml("Attached GPUs : 2\n" + data), expect=2)


def test_inventory_line_says_what_was_looked_at() -> None:
    from gpuvigil.commands.report_view import inventory_line

    node = faults.apply(gpu.make_node(8), Fault.GPU_OFF_BUS, gpu=3)
    line = inventory_line(parse_node(node))
    assert line == (
        "GPUs: 7 x NVIDIA H100 80GB HBM3 (Hopper), 1 not answering, driver 550.90.07, "
        "read via nvidia-smi"
    )


@pytest.mark.parametrize(
    ("said", "status", "error"),
    [
        ("Failed to initialize NVML: Driver/library version mismatch", 18, "LibRmVersionMismatch"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            9,
            "DriverNotLoaded",
        ),
    ],
    ids=["version-mismatch", "no-driver"],
)
def test_binary_error_answer_is_read_as_analyze_reads_it(fake_bin, said, status, error) -> None:
    # check's fallback and `analyze` read nvidia-smi's error answers with one reader
    # (parse_xml): what it says is a reading for the rules, not an unreadable tool.
    fake_bin("nvidia-smi", f'#!/bin/sh\necho "{said}"\nexit {status}\n')
    inv, failure = nvidia_smi.collect(ctx_with(f"{fake_bin.dir}:/usr/bin:/bin"), timeout_s=10)
    assert failure is None and inv is not None
    assert error in [e.error for e in inv.errors]
    same = nvidia_smi.parse_xml(said + "\n")  # what `analyze` makes of the same text
    assert [e.error for e in inv.errors] == [e.error for e in same.errors]
