"""The runner: the worker subprocess, its deadlines, restarts and fail-closed outcomes.

Each case runs a real worker process on the CPU (about 2 s of torch import each).
"""

from __future__ import annotations

import os

import pytest

from gpuvigil.core.findings import Status
from gpuvigil.node.active.config import ActiveConfig
from gpuvigil.node.active.runner import run_active

pytest_plugins = ["active_fixtures"]  # this folder's fixtures (see active_fixtures.py)

pytestmark = pytest.mark.usefixtures("need_torch")
SMALL = {"matmul_size": 32, "memory_bytes_cpu": 1 << 20, "dtypes": ["fp32", "bf16"]}


def cfg(**kw):
    return ActiveConfig.model_validate(SMALL | kw)


def codes(outcome):
    return sorted((f.check, f.code) for f in outcome.findings)


def test_healthy_checks_measure_and_pass():
    out = run_active(cfg(checks=["matmul", "memory"]), device="cpu", budget_s=60)
    assert out.findings == []
    assert out.workers == 1 and out.devices == ["cpu", "cpu"]
    assert {m.check for m in out.measurements} == {"matmul", "memory"}
    assert set(out.durations_s) == {"matmul", "memory"}


def test_hang_is_killed_by_the_watchdog_and_the_rest_still_runs():
    out = run_active(
        cfg(checks=["matmul", "memory"], timeouts_s={"matmul": 2}),
        device="cpu",
        budget_s=60,
        wrapper="gpuvigil.fakes.active:hanging_matmul",
    )
    assert codes(out) == [("active.matmul", "CHECK_TIMEOUT")]
    assert out.findings[0].component == "cpu:1"  # blamed on the device that hung
    assert out.workers == 2  # restarted for the checks after the hung one
    assert {m.check for m in out.measurements} == {"memory"}


def test_frozen_process_is_killed_at_the_budget():
    out = run_active(
        cfg(checks=["matmul", "memory"]),
        device="cpu",
        # Enough budget for the worker to import torch on a loaded machine; the frozen
        # check then uses up the rest.
        budget_s=20,
        wrapper="gpuvigil.fakes.active:frozen_matmul",
    )
    assert codes(out) == [("active.matmul", "CHECK_TIMEOUT"), ("active.memory", "CHECK_TIMEOUT")]
    by = {f.check: f for f in out.findings}
    assert "killed at the preflight deadline" in by["active.matmul"].message
    assert by["active.matmul"].component == "cpu:1"
    assert "budget ran out" in by["active.memory"].message
    assert out.duration_s < 30


def test_crash_is_a_check_error_and_the_rest_still_runs():
    out = run_active(
        cfg(checks=["matmul", "memory"]),
        device="cpu",
        budget_s=60,
        wrapper="gpuvigil.fakes.active:crashing_matmul",
    )
    assert codes(out) == [("active.matmul", "CHECK_ERROR")]
    assert "exit status 139" in out.findings[0].message
    assert out.findings[0].component == "cpu:1"
    assert {m.check for m in out.measurements} == {"memory"}


def test_ecc_error_is_a_memory_fault_of_that_gpu_and_the_worker_restarts():
    out = run_active(
        cfg(checks=["memory", "matmul"]),
        device="cpu",
        budget_s=60,
        wrapper="gpuvigil.fakes.active:ecc_error",
    )
    assert codes(out) == [("active.memory", "GPU_MEMORY_FAULT")]
    f = out.findings[0]
    assert f.component == "cpu:1" and "ECC" in f.message and f.fatal
    assert out.workers == 2  # a CUDA error may poison the context: a fresh worker goes on
    assert {m.check for m in out.measurements} == {"matmul"}


def test_no_cuda_is_driver_unavailable_for_every_check():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = run_active(cfg(checks=["matmul", "load"]), device="cuda", budget_s=60)
    assert codes(out) == [
        ("active.load", "DRIVER_UNAVAILABLE"),
        ("active.matmul", "DRIVER_UNAVAILABLE"),
    ]
    assert all(f.could_not_run for f in out.findings)


def test_broken_worker_fails_closed():
    out = run_active(
        cfg(checks=["matmul"]), device="cpu", budget_s=60, wrapper="gpuvigil.no_such_module:x"
    )
    assert ("active.matmul", "CHECK_ERROR") in codes(out)
    assert all(f.status is Status.FAILED for f in out.findings)


def test_no_budget_means_not_run_never_skipped():
    out = run_active(cfg(checks=["matmul", "load"]), device="cpu", budget_s=1)
    assert codes(out) == [("active.load", "CHECK_TIMEOUT"), ("active.matmul", "CHECK_TIMEOUT")]
    assert out.workers == 0


def test_slow_fabric_across_nodes_is_fabric_slow():
    """Two workers as two nodes (two CPU devices each); every all-reduce is slowed."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuvigil.io.ports import free_port

    port = free_port()

    def node(rank: int):
        c = cfg(
            checks=["allreduce"],
            allreduce_bytes=1 << 16,
            peers={"master_addr": "127.0.0.1", "master_port": port, "nnodes": 2, "node_rank": rank},
            expected={"internode_busbw_gbs": 0.01},
        )
        return run_active(
            c, device="cpu", budget_s=90, wrapper="gpuvigil.fakes.active:slow_all_reduce"
        )

    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(node, (0, 1)))
    for out in outs:
        assert codes(out) == [("active.allreduce", "FABRIC_SLOW")]
        f = out.findings[0]
        assert f.component == "fabric" and f.evidence["world"] == 4
        assert f.evidence["achieved"] < 0.5 * f.evidence["expected"]


def test_worker_still_starting_at_the_deadline_is_a_timeout(tmp_path):
    # A worker that cannot even get going (a loaded machine, a hung filesystem) within the
    # budget: every check it would have run is CHECK_TIMEOUT, not a broken worker.
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = run_active(cfg(checks=["matmul", "memory"]), device="cpu", budget_s=6, env=env)
    assert ("active.matmul", "CHECK_TIMEOUT") in codes(out)
    assert ("active.memory", "CHECK_TIMEOUT") in codes(out)
    assert all(f.code != "CHECK_ERROR" for f in out.findings if f.check != "active")
