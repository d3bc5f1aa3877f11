"""Pure judgements of the active checks, and measurement -> finding."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.core.findings import Action, Status
from gpuvigil.node.active.results import Measurement, to_finding
from gpuvigil.node.checks.active import rules
from gpuvigil.node.preflight import internode_expectation

pytest_plugins = ["active_fixtures"]  # this folder's fixtures (see active_fixtures.py)


def test_busbw_follows_nccl_tests():
    # nccl-tests: busbw = algbw * 2(n-1)/n for all-reduce; 8 ranks -> 1.75 x algbw.
    assert rules.busbw(1e9, 1.0, 8) == 1.75
    assert rules.busbw(1e9, 1.0, 2) == 1.0
    assert rules.busbw(1e9, 0.0, 8) == 0.0


def test_below_and_ratio():
    assert rules.below(10, 100, 0.5) and not rules.below(60, 100, 0.5)
    assert not rules.below(10, None, 0.5) and not rules.below(None, 100, 0.5)
    assert rules.below(math.nan, 100, 0.5)
    assert rules.ratio(50, 100) == 0.5 and rules.ratio(50, None) is None


def test_laggards_against_the_median():
    assert rules.laggards({"0": 100, "1": 98, "2": 60, "3": 101}, 0.8) == {"2": 99.0}
    assert rules.laggards({"0": 100}, 0.8) == {}


def test_wrong_per_dtype():
    assert rules.wrong(0.02, "bf16") is False and rules.wrong(0.02, "fp16") is True
    assert rules.wrong(math.inf, "fp32") and rules.wrong(math.nan, "bf16")


@given(
    st.floats(allow_nan=True),
    st.floats(allow_nan=True),
    st.integers(-5, 100),
    st.floats(allow_nan=True),
)
def test_rules_never_raise(a, b, n, f):
    rules.busbw(a, b, n)
    rules.below(a, b, f)
    rules.ratio(a, b)
    rules.wrong(a, "bf16")
    rules.laggards({"x": a, "y": b}, 0.8)


def test_measurement_to_finding():
    ok = Measurement(
        check="load",
        component="gpu:0",
        metric="tflops_bf16",
        achieved=700.0,
        expected=989.0,
        unit="TFLOP/s",
    )
    assert to_finding(ok, observed_at=ok_time()) is None
    sdc = Measurement(
        check="matmul",
        component="gpu:3",
        metric="bf16_max_error",
        achieved=5.0,
        expected=0.03,
        unit="normalised error",
        status="FAILED",
        code="GPU_SDC",
        message="wrong",
        evidence={"dtype": "bf16"},
    )
    f = to_finding(Measurement.from_json(sdc.to_json()), observed_at=ok_time())
    assert f is not None
    assert (f.check, f.code, f.component, f.status) == (
        "active.matmul",
        "GPU_SDC",
        "gpu:3",
        Status.FAILED,
    )
    assert f.fatal and f.action is Action.REPLACE
    assert f.evidence == {
        "metric": "bf16_max_error",
        "achieved": 5.0,
        "expected": 0.03,
        "unit": "normalised error",
        "dtype": "bf16",
    }


def test_internode_expectation_from_the_catalog():
    from gpuvigil.node.catalog.instances import load_catalog

    cat = load_catalog()
    assert internode_expectation(cat.lookup("p5.48xlarge")) == 3200 / 8 / 8  # 50 GB/s/GPU
    assert internode_expectation(cat.lookup("dgx-h100")) == 8 * 400 / 8 / 8
    assert internode_expectation(cat.lookup("a3-highgpu-8g")) is None
    assert internode_expectation(None) is None


def ok_time():
    from gpuvigil.core.findings import utcnow

    return utcnow()


_events = st.one_of(
    st.text(max_size=60),
    st.dictionaries(
        st.sampled_from(
            [
                "event",
                "check",
                "measurements",
                "component",
                "code",
                "message",
                "timeout_s",
                "names",
                "models",
                "duration_s",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=10),
            st.sampled_from(
                ["start", "result", "error", "timeout", "fatal", "progress", "devices"]
            ),
            st.lists(st.dictionaries(st.text(max_size=8), st.integers(), max_size=3), max_size=2),
        ),
        max_size=6,
    ).map(lambda d: __import__("json").dumps(d)),
)


@given(
    st.lists(_events, max_size=8),
    st.sampled_from([None, "timeout", "missing"]),
    st.one_of(st.none(), st.integers(-9, 255)),
)
def test_worker_output_parser_never_raises(lines, error, rc):
    from gpuvigil.io.exec import ExecResult
    from gpuvigil.node.active.runner import ActiveOutcome, _absorb

    result = ExecResult(
        argv=("python",),
        returncode=rc,
        stdout="\n".join(lines).encode(),
        stderr=b"",
        duration_s=1.0,
        error=error,
    )
    outcome = ActiveOutcome()
    done, _fatal = _absorb(result, outcome)
    assert isinstance(done, set)
    assert all(f.status is Status.FAILED for f in outcome.findings)


def test_gpu_components_follow_the_hosts_pci_order(tmp_path):
    from gpuvigil.fakes.sysfs import FakeSysfs
    from gpuvigil.node.active.ops import host_gpu_indexes

    fs = FakeSysfs(tmp_path)
    for addr in ("0000:c0:00.0", "0000:18:00.0", "0000:9a:00.0"):
        fs.add_gpu(addr)
    fs.add_ib("mlx5_0", address="0000:19:00.0")  # not a GPU
    assert host_gpu_indexes(str(tmp_path)) == {
        "0000:18:00.0": 0,
        "0000:9a:00.0": 1,
        "0000:c0:00.0": 2,
    }
    assert host_gpu_indexes(str(tmp_path / "nowhere")) == {}


def test_torch_index_is_mapped_to_the_host_index(need_torch):
    from gpuvigil.node.active.ops import TorchOps

    ops = TorchOps("cpu", cpu_devices=2)
    ops.kind = "cuda"  # as if CUDA_VISIBLE_DEVICES had handed us host GPUs 5 and 2
    ops.pci = ["0000:c0:00.0", "0000:4f:00.0"]
    ops._host_index = {"0000:4f:00.0": 2, "0000:c0:00.0": 5}
    assert [ops.component(0), ops.component(1)] == ["gpu:5", "gpu:2"]
    ops.pci = [None, "0000:ff:00.0"]  # unknown: torch's index, never a crash
    assert [ops.component(0), ops.component(1)] == ["gpu:0", "gpu:1"]
