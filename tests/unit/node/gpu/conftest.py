"""Fixtures for the GPU probes: a fake node in a scenario file, a context pointing at it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuvigil.fakes import gpu
from gpuvigil.node import sweep
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.gpu import nvml
from gpuvigil.node.config import NodeConfig


@pytest.fixture(autouse=True)
def _checks_loaded() -> None:
    sweep.load_checks()


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[tuple[gpu.FakeNode, Path]]:
    node = gpu.make_node(8)
    path = tmp_path / "node.json"
    node.save(path)
    yield node, path
    nvml.close_all()  # never leave a worker behind


@pytest.fixture
def make_ctx(scenario) -> Callable[..., CheckContext]:
    _, path = scenario

    def make(*, path_env: str | None = None, **gpu_cfg: object) -> CheckContext:
        expect = gpu_cfg.pop("expect_gpus", 8)
        cfg = NodeConfig.model_validate(
            {
                "expect_gpus": expect,
                "gpu": {"nvml_module": "gpuvigil.fakes.nvml", "nvml_timeout_s": 3, **gpu_cfg},
            }
        )
        env = dict(os.environ)
        env[gpu.SCENARIO_ENV] = str(path)
        if path_env is not None:
            env["PATH"] = path_env
        return CheckContext(config=cfg, env=env)

    return make
