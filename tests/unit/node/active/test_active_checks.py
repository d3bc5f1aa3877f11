"""Each active check on the CPU: healthy passes, injected faults are found.

Faults wrap the compute (`gpuvigil.fakes.active`); the expectations are the ones a user
would configure for this device and stay the same between the healthy and faulty runs.
"""

from __future__ import annotations

import pytest

from gpuvigil.node.active import bandwidth, matmul, memory
from gpuvigil.node.active.config import ActiveConfig

pytest_plugins = ["active_fixtures"]  # this folder's fixtures (see active_fixtures.py)


def problems(measurements):
    return sorted((m.component, m.code) for m in measurements if m.status != "OK")


def test_matmul_correct_in_every_dtype(cpu_ops, small):
    ms = matmul.correctness(cpu_ops(), small, small.sizes("cpu"))
    assert {m.metric for m in ms} == {
        "bf16_max_error",
        "fp16_max_error",
        "tf32_max_error",
        "fp32_max_error",
    }
    assert problems(ms) == []
    for m in ms:
        assert 0 <= m.achieved < m.expected
        assert m.evidence["bitwise_repeatable"] is True


def test_wrong_result_is_sdc(cpu_ops, small):
    ms = matmul.correctness(cpu_ops("wrong_matmul"), small, small.sizes("cpu"))
    assert problems(ms) == [("cpu:1", "GPU_SDC")] * 4
    bad = [m for m in ms if m.component == "cpu:1"]
    assert all(m.achieved > m.expected for m in bad)
    assert "float64 reference" in bad[0].message


def test_result_changing_between_repeats_is_sdc(cpu_ops, small):
    ms = matmul.correctness(cpu_ops("flaky_matmul"), small, small.sizes("cpu"))
    flagged = [m for m in ms if m.code == "GPU_SDC"]
    assert {m.component for m in flagged} == {"cpu:1"}
    assert "repeats" in flagged[0].message
    assert flagged[0].evidence["bitwise_repeatable"] is False


def test_a_bit_no_tolerance_sees_is_found_by_the_peers(cpu_ops, small):
    cfg = small.model_copy(update={"dtypes": ["fp32", "bf16"]})
    ms = matmul.correctness(cpu_ops("subtle_matmul", devices=3), cfg, cfg.sizes("cpu"))
    assert problems(ms) == [("cpu:1", "GPU_SDC")] * 2
    bad = next(m for m in ms if m.code)
    assert bad.achieved < bad.expected  # within tolerance: only the peers disagree
    assert "differs bitwise from 2 of 3" in bad.message
    # With two devices there is no majority: both are flagged, as a WARNING.
    two = matmul.correctness(cpu_ops("subtle_matmul"), cfg, cfg.sizes("cpu"))
    assert sorted((m.component, m.status) for m in two if m.code) == [
        ("cpu:0", "WARNING"),
        ("cpu:0", "WARNING"),
        ("cpu:1", "WARNING"),
        ("cpu:1", "WARNING"),
    ]


def test_load_reports_tflops_and_passes(cpu_ops, small):
    # 0.2 GFLOP/s expected: a 48x48 fp32 matmul call beats 0.4 of it unless the machine
    # stalls it for ~3 ms every call; the all-slow injector (20 ms a call) does not.
    cfg = small.model_copy(update={"expected": {"tflops": {"fp32": 0.0002}}})
    ms = matmul.load(cpu_ops(), cfg, cfg.sizes("cpu"), {0: 0.0002, 1: 0.0002})
    assert problems(ms) == []
    assert all(m.metric == "tflops_fp32" and m.achieved > 0 for m in ms)
    assert all(m.evidence["iterations"] > 1 for m in ms)


def test_cpu_devices_compute_on_one_thread(cpu_ops):
    # With torch's default threads, a loaded 2-core machine made each 48x48 call of the
    # test above wait ~16 ms for the second thread (GPU_SLOW on both devices, 2 runs of 8).
    ops = cpu_ops()
    assert ops.torch.get_num_threads() == 1


def test_one_slow_device_is_slow_against_its_peers(cpu_ops, small):
    ms = matmul.load(cpu_ops("slow_matmul"), small, small.sizes("cpu"), {})
    assert problems(ms) == [("cpu:1", "GPU_SLOW")]
    assert "median" in next(m for m in ms if m.code).message


def test_all_slow_is_slow_against_the_expected_figure(cpu_ops, small):
    ms = matmul.load(cpu_ops("all_slow_matmul"), small, small.sizes("cpu"), {0: 0.0002, 1: 0.0002})
    assert problems(ms) == [("cpu:0", "GPU_SLOW"), ("cpu:1", "GPU_SLOW")]
    assert all(m.evidence["ratio_to_peak"] < small.min_fraction_of_peak for m in ms)


def test_result_drifting_under_load_is_sdc(cpu_ops, small):
    ms = matmul.load(cpu_ops("flaky_matmul"), small, small.sizes("cpu"), {})
    assert ("cpu:1", "GPU_SDC") in problems(ms)


def test_memory_patterns(cpu_ops, small):
    assert problems(memory.pattern_test(cpu_ops(), small)) == []
    ms = memory.pattern_test(cpu_ops("bad_memory"), small)
    assert problems(ms) == [("cpu:1", "GPU_MEMORY_FAULT")]
    bad = next(m for m in ms if m.code)
    assert bad.achieved >= 2 and 4099 in bad.evidence["first_bad_offsets"]
    assert bad.evidence["tested_bytes"] == small.memory_bytes_cpu


def test_bandwidth(cpu_ops, small, monkeypatch):
    monkeypatch.setattr(bandwidth, "REPEATS", 2)
    cfg = small.model_copy(update={"min_bandwidth_fraction": 0.5, "transfer_bytes": 1 << 16})
    # Expected 0.002 GB/s: a healthy 64 KiB memcpy beats half of it by >100x even on a
    # loaded 2-core machine; device 1's injected 0.2 s per copy puts it 3x below.
    exp = {0: 0.002, 1: 0.002}
    ms = bandwidth.transfers(cpu_ops(), cfg, cfg.sizes("cpu"), h2d_expected=exp, p2p_expected=exp)
    assert {m.metric for m in ms} == {"h2d_gbs", "d2h_gbs", "p2p_gbs"}
    assert problems(ms) == []
    slow = bandwidth.transfers(
        cpu_ops("slow_copy"), cfg, cfg.sizes("cpu"), h2d_expected=exp, p2p_expected=exp
    )
    assert problems(slow) == [
        ("cpu:1", "NVLINK_SLOW"),
        ("cpu:1", "PCIE_SLOW"),
        ("cpu:1", "PCIE_SLOW"),
    ]


def test_unknown_expectation_is_reported_not_judged(cpu_ops, small, monkeypatch):
    monkeypatch.setattr(bandwidth, "REPEATS", 1)
    ms = bandwidth.transfers(
        cpu_ops("slow_copy"), small, small.sizes("cpu"), h2d_expected={}, p2p_expected={}
    )
    assert problems(ms) == [] and all(m.expected is None for m in ms)


@pytest.mark.parametrize(
    ("fault", "code"),
    [(None, None), ("slow_all_reduce", "NVLINK_SLOW"), ("wrong_all_reduce", "GPU_SDC")],
)
def test_allreduce_within_the_node(cpu_ops, small, fault, code):
    from gpuvigil.node.active import allreduce

    cfg = small.model_copy(update={"timeouts_s": {"allreduce": 60}})
    wrapper = f"gpuvigil.fakes.active:{fault}" if fault else None
    ms = allreduce.allreduce(
        cpu_ops(), cfg, cfg.sizes("cpu"), wrapper=wrapper, expected_intra=0.01, expected_inter=None
    )
    assert len(ms) == 1
    m = ms[0]
    assert (m.metric, m.component, m.code) == ("busbw_gbs", "node", code)
    if code is None:
        assert m.achieved > 0 and m.evidence["world"] == 2


def test_sizes_follow_the_device():  # pure config: no torch needed
    gpu, cpu = ActiveConfig().sizes("cuda"), ActiveConfig().sizes("cpu")
    assert gpu.matmul_size > cpu.matmul_size and gpu.load_dtype == "bf16"
    assert cpu.load_dtype == "fp32" and cpu.load_s <= 2
    assert ActiveConfig(timeouts_s={"load": 5}).sizes("cpu").timeouts_s["load"] == 5
