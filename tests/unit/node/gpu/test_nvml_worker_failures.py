"""The NVML worker itself misbehaving: a binding that crashes the process, prints garbage
on stdout, or floods it. Each is a failure of the gpu check, never a pass; and whatever
the worker prints, turning it into readings never raises (hypothesis)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import utcnow
from gpuvigil.node.catalog import gpus as catalog
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.checks.gpu import nvml
from gpuvigil.node.checks.gpu.nvml_readings import inventory_from_lines
from gpuvigil.node.checks.gpu.rules import gpu as rules
from gpuvigil.node.config import GpuConfig, NodeConfig

# A binding that behaves like the fake NVML until one call does something terrible.
BINDING = """
from gpuvigil.fakes.nvml import *  # noqa: F403
from gpuvigil.fakes import nvml as _fake
from gpuvigil.fakes import gpu as _gpu
import os, sys
_fake.install(_gpu.make_node(2))

def nvmlDeviceGetSerial(handle):
    {body}
"""

BODIES = {
    "crash": "os._exit(3)",
    "segfault": "import ctypes; ctypes.string_at(0)",
    "garbage": "sys.stdout.write('}}not json{{\\n'); sys.stdout.flush(); return 'x'",
    "flood": "sys.stdout.write('x' * (8 * 1024 * 1024)); sys.stdout.flush(); return 'x'",
    "raise": "raise RuntimeError('binding bug')",
}


@pytest.fixture
def binding(tmp_path: Path):
    def make(kind: str) -> CheckContext:
        name = f"gpuvigil_test_binding_{kind}"
        (tmp_path / f"{name}.py").write_text(BINDING.format(body=BODIES[kind]))
        cfg = NodeConfig.model_validate(
            {"expect_gpus": 2, "gpu": {"nvml_module": name, "nvml_timeout_s": 5}}
        )
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "PATH": "/nonexistent"}
        return CheckContext(config=cfg, env=env)

    yield make
    nvml.close_all()


@pytest.mark.parametrize("kind", ["crash", "segfault", "garbage", "flood"])
def test_worker_failure_is_check_error(binding, kind: str) -> None:
    from gpuvigil.node import sweep

    sweep.load_checks()
    findings, run = run_check(REGISTRY["gpu"], binding(kind))
    assert run.status == "FAILED"
    assert [f.code for f in findings] == ["CHECK_ERROR"], [f.message for f in findings]
    assert "worker" in findings[0].message


def test_binding_exception_is_a_read_error_not_a_pass(binding) -> None:
    from gpuvigil.node import sweep

    sweep.load_checks()
    findings, _ = run_check(REGISTRY["gpu"], binding("raise"))
    assert {(f.code, f.component) for f in findings} == {
        ("CHECK_ERROR", "gpu:0"),
        ("CHECK_ERROR", "gpu:1"),
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6)
    ),
    max_leaves=20,
)
FIELDS = [
    "name",
    "pci",
    "ecc_mode",
    "remapped_rows",
    "clock_event_reasons",
    "nvlinks",
    "temperature_gpu",
    "ecc_volatile_uncorrected",
    "pcie_width",
    "architecture",
]
raw_dicts = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), json_values, max_size=8)
lines = st.lists(
    st.one_of(
        st.builds(lambda i, r: {"gpu": i, "raw": r}, st.integers(-2, 9), raw_dicts),
        st.builds(lambda i, e: {"gpu": i, "handle_error": e}, st.integers(0, 9), json_values),
        st.builds(
            lambda c, d: {"done": True, "count": c, "driver_version": d}, json_values, json_values
        ),
        json_values,
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(lines)
def test_any_worker_answer_converts_without_raising(answer) -> None:
    inv = inventory_from_lines(answer, observed_at=datetime(2026, 11, 30, tzinfo=UTC))
    rules.judge_inventory(inv, cfg=GpuConfig(), catalog=catalog.load(), now=utcnow(), expect=8)
