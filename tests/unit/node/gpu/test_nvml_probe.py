"""The NVML check end to end through the worker process and the fake NVML: healthy, each
fault, and every fail-closed path (hang, lost, no library, no driver, no binding, crash)."""

from __future__ import annotations

import os
import time

import pytest

from gpuvigil.fakes import faults
from gpuvigil.fakes.faults import Fault
from gpuvigil.node.checks import REGISTRY, run_check
from gpuvigil.node.checks.gpu import nvml
from gpuvigil.node.checks.gpu.readings import GpuInventory, NvmlXidEvents


def codes(findings):
    return sorted((f.code, f.component) for f in findings)


def run_gpu(ctx):
    return run_check(REGISTRY["gpu"], ctx)


def test_healthy_node_has_no_findings(make_ctx) -> None:
    findings, run = run_gpu(make_ctx())
    assert findings == [] and run.status == "OK"


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (Fault.ECC_UNCORRECTABLE, {"ECC_UNCORRECTED_VOLATILE", "ROW_REMAP_PENDING"}),
        (Fault.ROW_REMAP_FAILURE, {"ROW_REMAP_FAILURE", "ECC_UNCORRECTED_VOLATILE"}),
        (Fault.NVLINK_DOWN, {"NVLINK_DOWN"}),
        (Fault.THERMAL_SLOWDOWN, {"THERMAL_SLOWDOWN", "TEMPERATURE_HIGH"}),
        (Fault.HW_SLOWDOWN, {"HW_SLOWDOWN"}),
        (Fault.POWER_BRAKE, {"POWER_BRAKE"}),
        (Fault.PCIE_DEGRADED, {"PCIE_DEGRADED"}),
        (Fault.GPU_OFF_BUS, {"GPU_LOST"}),
    ],
)
def test_fault_is_found_on_its_gpu(scenario, make_ctx, fault, expected) -> None:
    node, path = scenario
    faults.apply(node, fault, gpu=3)
    node.save(path)
    findings, _ = run_gpu(make_ctx())
    assert expected <= {f.code for f in findings}
    assert {f.component for f in findings if f.code in expected} == {"gpu:3"}


def test_volta_page_retirement_through_nvml(tmp_path, make_ctx, scenario) -> None:
    from gpuvigil.fakes import gpu as fake_gpu

    _, path = scenario
    node = fake_gpu.make_node(8, model="V100")
    faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=2)
    node.save(path)
    findings, _ = run_gpu(make_ctx())
    assert {("RETIRED_PAGES_PENDING", "gpu:2"), ("ECC_UNCORRECTED_VOLATILE", "gpu:2")} <= set(
        codes(findings)
    )


@pytest.mark.parametrize(("action", "ours"), [(1, "RESET_GPU"), (2, "REBOOT"), (4, "RESET_GPU")])
def test_driver_recovery_action(scenario, make_ctx, action, ours) -> None:
    node, path = scenario
    node.gpus[6].recovery_action = action
    node.save(path)
    (f,) = run_gpu(make_ctx())[0]
    assert (f.code, f.component, f.action) == ("GPU_RECOVERY_REQUIRED", "gpu:6", ours)
    # The same verdict read back from nvidia-smi -q -x (the fallback and analyze).
    from gpuvigil.fakes import nvidia_smi as fake_smi
    from gpuvigil.node.checks.gpu import nvidia_smi

    smi = nvidia_smi.parse_xml(fake_smi.render_xml(node)).gpus[6].recovery_action
    assert smi == ("DRAIN_AND_RESET" if action == 4 else "GPU_RESET")


def test_gpu_gone_from_the_bus_is_count_low(scenario, make_ctx) -> None:
    node, path = scenario
    node.gpus[5].present = False
    node.save(path)
    findings, _ = run_gpu(make_ctx())
    assert [(f.code, f.status) for f in findings] == [("GPU_COUNT_LOW", "FAILED")]
    assert findings[0].evidence["seen"] == 7


def test_unknown_error_is_gpu_lost(scenario, make_ctx) -> None:
    node, path = scenario
    node.gpus[1].errors = {"nvmlDeviceGetRemappedRows": 999}
    node.save(path)
    findings, _ = run_gpu(make_ctx())
    assert codes(findings) == [("GPU_LOST", "gpu:1")]


def test_other_nvml_error_fails_closed(scenario, make_ctx) -> None:
    node, path = scenario
    node.gpus[1].errors = {"nvmlDeviceGetTotalEccErrors": 4}  # NoPermission
    node.save(path)
    findings, _ = run_gpu(make_ctx())
    assert codes(findings) == [("CHECK_ERROR", "gpu:1")]


def test_hang_is_check_timeout_and_worker_replaced(scenario, make_ctx) -> None:
    node, path = scenario
    node.gpus[4].hang = True
    node.save(path)
    ctx = make_ctx(nvml_timeout_s=1.5)
    t0 = time.monotonic()
    findings, run = run_gpu(ctx)
    assert time.monotonic() - t0 < 6
    assert codes(findings) == [("CHECK_TIMEOUT", "gpu:4")]  # and nothing else is missing
    assert run.status == "FAILED"
    client = nvml.client_for("gpuvigil.fakes.nvml", ctx.env)
    assert client.starts == 2  # the hung worker was killed; a new one read GPUs 5-7
    node.gpus[4].hang = False
    node.save(path)
    findings, _ = run_gpu(ctx)
    assert findings == [] and client.starts == 2


def test_a_hung_gpu_hides_nothing_on_a_later_gpu(scenario, make_ctx) -> None:
    """GPU 2 hangs in the driver and GPU 5 has an uncorrectable ECC error: each GPU has
    its own deadline, so both are reported on their own GPU and every GPU is accounted
    for (no GPU_COUNT_LOW, no node-wide timeout)."""
    node, path = scenario
    node.gpus[2].hang = True
    faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=5)
    node.save(path)
    ctx = make_ctx(nvml_timeout_s=1.5)
    findings, _ = run_gpu(ctx)
    got = codes(findings)
    assert ("CHECK_TIMEOUT", "gpu:2") in got
    assert ("ECC_UNCORRECTED_VOLATILE", "gpu:5") in got
    assert {component for _, component in got} == {"gpu:2", "gpu:5"}
    inv = ctx.facts.get(GpuInventory)
    assert inv is not None and [g.index for g in inv.gpus] == list(range(8))
    assert [e.error for e in inv.gpus[2].errors] == ["Timeout"]
    hung = next(f for f in findings if f.component == "gpu:2")
    assert "GPU 2 did not answer within 1.5 s" in hung.message, hung.message
    assert inv.gpus[6].ecc_volatile_uncorrected == 0  # read after the hang, by a new worker


def test_hung_gpus_past_the_budget_are_each_a_timeout(scenario, make_ctx) -> None:
    node, path = scenario
    for i in (1, 2, 3):
        node.gpus[i].hang = True
    node.save(path)
    ctx = make_ctx(nvml_timeout_s=1.0, nvml_budget_s=1.8)
    findings, _ = run_gpu(ctx)
    timed_out = {c for code, c in codes(findings) if code == "CHECK_TIMEOUT"}
    assert {"gpu:1", "gpu:2"} <= timed_out  # GPU 2's own deadline, or the budget's end
    assert not any(code == "GPU_COUNT_LOW" for code, _ in codes(findings))


def test_warm_worker_is_reused(make_ctx) -> None:
    ctx = make_ctx()
    run_gpu(ctx)
    client = nvml.client_for("gpuvigil.fakes.nvml", ctx.env)
    pid = client.pid
    run_gpu(ctx)
    assert client.pid == pid and client.starts == 1


def test_worker_killed_under_us_is_restarted(make_ctx) -> None:
    ctx = make_ctx()
    run_gpu(ctx)
    client = nvml.client_for("gpuvigil.fakes.nvml", ctx.env)
    os.kill(client.pid, 9)
    time.sleep(0.1)
    findings, _ = run_gpu(ctx)
    assert findings == [] and client.starts == 2


def test_library_not_found_is_driver_unavailable(scenario, make_ctx, fake_bin) -> None:
    node, path = scenario
    node.library_present = False
    node.save(path)
    findings, _ = run_gpu(make_ctx(path_env=str(fake_bin.dir)))
    assert [f.code for f in findings] == ["DRIVER_UNAVAILABLE"]
    assert "LibraryNotFound" in findings[0].message and "nvidia-smi" in findings[0].message


def test_driver_not_loaded_is_driver_unavailable(scenario, make_ctx, fake_bin) -> None:
    node, path = scenario
    faults.apply(node, Fault.DRIVER_UNAVAILABLE)
    node.save(path)
    findings, _ = run_gpu(make_ctx(path_env=str(fake_bin.dir)))
    assert [f.code for f in findings] == ["DRIVER_UNAVAILABLE"]
    assert findings[0].could_not_run


def test_no_gpus_expected_and_no_driver_is_fine(scenario, make_ctx, fake_bin) -> None:
    node, path = scenario
    node.library_present = False
    node.save(path)
    findings, _ = run_gpu(make_ctx(path_env=str(fake_bin.dir), expect_gpus=0))
    assert findings == []


def test_missing_binding_falls_back_to_nvidia_smi(make_ctx, fake_bin, tmp_path) -> None:
    from gpuvigil.fakes import gpu as fake_gpu
    from gpuvigil.fakes import nvidia_smi as fake_smi

    xml = tmp_path / "q.xml"
    xml.write_text(
        fake_smi.render_xml(faults.apply(fake_gpu.make_node(8), Fault.HW_SLOWDOWN, gpu=6))
    )
    fake_bin("nvidia-smi", f"#!/bin/sh\ncat {xml}\n")
    ctx = make_ctx(path_env=f"{fake_bin.dir}:/usr/bin:/bin", nvml_module="gpuvigil_no_such_binding")
    findings, _ = run_gpu(ctx)
    assert codes(findings) == [("HW_SLOWDOWN", "gpu:6"), ("SOURCE_FALLBACK", "node")]


def test_missing_binding_and_no_nvidia_smi(make_ctx, fake_bin) -> None:
    ctx = make_ctx(path_env=str(fake_bin.dir), nvml_module="gpuvigil_no_such_binding")
    findings, _ = run_gpu(ctx)
    assert [f.code for f in findings] == ["DEPENDENCY_MISSING"]


def test_init_hang_is_check_timeout(scenario, make_ctx) -> None:
    node, path = scenario
    node.init_hang = True
    node.save(path)
    findings, _ = run_gpu(make_ctx(nvml_timeout_s=1))
    assert [f.code for f in findings] == ["CHECK_TIMEOUT"]


def test_nvlink_errors_are_rates(scenario, make_ctx) -> None:
    node, path = scenario
    ctx = make_ctx()
    assert run_gpu(ctx)[0] == []
    faults.apply(node, Fault.NVLINK_ERRORS, gpu=2)
    node.save(path)
    findings, _ = run_gpu(ctx)
    assert codes(findings) == [("NVLINK_ERRORS", "gpu:2")]
    # Same totals next time: no new errors, no finding (totals are not judged).
    assert run_gpu(ctx)[0] == []


def test_xid_events_reach_the_kernel_log_seam(scenario, make_ctx) -> None:
    node, path = scenario
    ctx = make_ctx()
    assert run_gpu(ctx)[0] == []  # registers for events
    inv = ctx.facts.get(GpuInventory)
    assert inv is not None and inv.gpu_map()["0000:18:00.0"].family == "hopper"
    faults.apply(node, Fault.APP_XID_43, gpu=6)
    node.save(path)
    run_gpu(ctx)
    (ev,) = ctx.facts.get(NvmlXidEvents).events
    assert (ev.code, ev.source, ev.bus_id, ev.code_name) == (43, "nvml", "0000:ba:00.0", "XID_43")
    run_gpu(ctx)
    assert len(ctx.facts.get(NvmlXidEvents).events) == 1  # delivered once


def test_gpus_on_the_pci_bus_are_the_expectation_without_config(scenario, make_ctx, tmp_path):
    """8 NVIDIA GPUs in sysfs, 7 answering NVML, nothing configured: GPU_COUNT_LOW."""
    from gpuvigil.fakes.sysfs import FakeSysfs

    node, path = scenario
    node.gpus[7].present = False
    node.save(path)
    ctx = make_ctx(expect_gpus=None)
    ctx.root = FakeSysfs.node(tmp_path / "root", gpus=8, kind="ib", adapters=0).root
    findings, _ = run_gpu(ctx)
    assert [(f.code, f.evidence["expected"]) for f in findings] == [("GPU_COUNT_LOW", 8)]
    # No NVIDIA device on the bus and nothing configured: not "0 expected".
    ctx.root = tmp_path / "empty"
    node.library_present = False
    node.save(path)
    nvml.close_all()  # a fresh worker meets the missing library at init
    findings, _ = run_gpu(ctx)
    assert [f.code for f in findings if f.code == "DRIVER_UNAVAILABLE"] == ["DRIVER_UNAVAILABLE"]


def test_a_gpu_lost_since_the_last_sweep_keeps_its_name_for_its_xid(
    scenario, make_ctx, tmp_path
) -> None:
    """NVML cannot read a lost GPU's bus id, but the kernel prints it in the Xid 79 line:
    the gpu check's map of the previous sweep keeps the GPU's index, so the kernel-log
    check (real code, across the seam) names the Xid `gpu:3`, like GPU_LOST, and the GPU
    is not counted again as `pci:0000:5d:00.0`. The second sweep checks the map sticks."""
    node, path = scenario
    ctx = make_ctx()
    bus = node.gpus[3].pci_bus_id.removeprefix("0000")  # 0000:5D:00.0, as the kernel prints
    run_gpu(ctx)  # the healthy sweep
    faults.apply(node, Fault.GPU_OFF_BUS, gpu=3)
    node.save(path)
    log = tmp_path / "kern.log"
    log.write_text(f"[ 100.0] NVRM: Xid (PCI:{bus}): 79, pid=1, name=x, GPU has fallen off\n")
    ctx.config = ctx.config.model_copy(
        update={"kernel_log": ctx.config.kernel_log.model_copy(update={"file": str(log)})}
    )
    for _ in range(2):
        lost, _ = run_gpu(ctx)
        xids, _ = run_check(REGISTRY["kernel_log"], ctx)
        assert ("GPU_LOST", "gpu:3") in codes(lost)
        assert "gpu:3" in logged_xid79(xids) and "pci:0000:5d:00.0" not in logged_xid79(xids)
    fresh = make_ctx()  # an agent that never saw the GPU answer: only the bus id is known
    fresh.config = ctx.config
    run_gpu(fresh)
    xids, _ = run_check(REGISTRY["kernel_log"], fresh)
    assert "pci:0000:5d:00.0" in logged_xid79(xids)


def logged_xid79(findings) -> set[str]:
    """Components of the Xid 79 findings read from the kernel log (not NVML's events)."""
    return {f.component for f in findings if f.code == "XID_79" and "NVML" not in f.message}


def test_xid_79_from_nvml_names_the_lost_gpu_and_counts_once(scenario, make_ctx, tmp_path):
    """A GPU that fell off the bus answers no NVML call, its Xid event included: the worker
    names it from what the GPU said when it registered for events, so NVML's Xid 79 and
    the kernel's are one finding on gpu:3 (not a second one on an empty `pci:`)."""
    node, path = scenario
    ctx = make_ctx()
    bus = node.gpus[3].pci_bus_id.removeprefix("0000")
    run_gpu(ctx)  # healthy; registers for events
    faults.apply(node, Fault.GPU_OFF_BUS, gpu=3)
    node.save(path)
    log = tmp_path / "kern.log"
    log.write_text(f"[ 100.0] NVRM: Xid (PCI:{bus}): 79, pid=1, name=x, GPU has fallen off\n")
    ctx.config = ctx.config.model_copy(
        update={"kernel_log": ctx.config.kernel_log.model_copy(update={"file": str(log)})}
    )
    run_gpu(ctx)
    (ev,) = ctx.facts.get(NvmlXidEvents).events
    assert (ev.code, ev.bus_id) == (79, "0000:5d:00.0") and "GPU 3" in ev.line
    xids, _ = run_check(REGISTRY["kernel_log"], ctx)
    assert [f.component for f in xids if f.code == "XID_79"] == ["gpu:3"]


def test_an_event_naming_only_its_gpu_keeps_the_index():
    """NVML named the GPU by index and gave no bus, and the GPU map has none for it: the
    event keeps the index, so the Xid rules place it on gpu:N (never on an empty `pci:`)."""
    from datetime import UTC, datetime

    from gpuvigil.node.checks.gpu.nvml_client import Answer

    answer = Answer(lines=[{"events": [{"gpu": 3, "pci": {"error": "GPU_IS_LOST"}, "xid": 79}]}])
    (ev,) = nvml.xid_events_from_answer(answer, at=datetime(2026, 12, 3, tzinfo=UTC))
    assert (ev.code, ev.gpu_index, ev.bus_id, ev.pci_bus_id) == (79, 3, None, "")


def _fallback_prints(fake_bin, tmp_path, node, stderr: str) -> None:
    from gpuvigil.fakes import nvidia_smi as fake_smi

    xml, err = tmp_path / "q.xml", tmp_path / "err"
    xml.write_text(fake_smi.render_xml(node))
    err.write_text(stderr)
    fake_bin("nvidia-smi", f"#!/bin/sh\ncat {err} >&2\ncat {xml}\n")


def test_the_fallback_reads_error_text_as_analyze_does(make_ctx, fake_bin, tmp_path) -> None:
    """Issue #25: an error nvidia-smi printed beside a healthy-looking XML that no GPU rule
    explains is ERROR_TEXT ("could not tell"), as `analyze` judges the same output; an
    error a rule explains (a lost GPU: GPU_LOST) adds nothing."""
    from gpuvigil.fakes import gpu as fake_gpu
    from gpuvigil.fakes import nvidia_smi as fake_smi

    ctx_args = {"path_env": f"{fake_bin.dir}:/usr/bin:/bin", "nvml_module": "gpuvigil_no_such"}
    _fallback_prints(
        fake_bin,
        tmp_path,
        fake_gpu.make_node(8),
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n",
    )
    findings, _ = run_gpu(make_ctx(**ctx_args))
    (said,) = [f for f in findings if f.code == "ERROR_TEXT"]
    assert said.status.name == "FAILED" and "fallen off the bus" in said.message
    assert said.component == "input:nvidia-smi"

    lost = faults.apply(fake_gpu.make_node(8), Fault.GPU_OFF_BUS, gpu=3)
    _fallback_prints(fake_bin, tmp_path, lost, fake_smi.lost_lines(lost))
    findings, _ = run_gpu(make_ctx(**ctx_args))
    assert "GPU_LOST" in {f.code for f in findings}
    assert "ERROR_TEXT" not in {f.code for f in findings}, findings

    _fallback_prints(fake_bin, tmp_path, fake_gpu.make_node(8), "")
    findings, _ = run_gpu(make_ctx(**ctx_args))
    assert codes(findings) == [("SOURCE_FALLBACK", "node")]
