"""The NVML check end to end through the worker process and the fake NVML: healthy, each
fault, and every fail-closed path (hang, lost, no library, no driver, no binding, crash)."""

from __future__ import annotations

import os
import time

import pytest

from gpuvigil.fakes import faults
from gpuvigil.fakes.faults import Fault
from gpuvigil.node.checks import REGISTRY, run_check
from gpuvigil.node.probes import nvml


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
    assert time.monotonic() - t0 < 5
    assert ("CHECK_TIMEOUT", "gpu:4") in codes(findings)
    assert run.status == "FAILED"
    client = nvml.client_for("gpuvigil.fakes.nvml", ctx.env)
    assert client.pid is None  # the hung worker was killed
    node.gpus[4].hang = False
    node.save(path)
    findings, _ = run_gpu(ctx)
    assert findings == [] and client.starts == 2


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
