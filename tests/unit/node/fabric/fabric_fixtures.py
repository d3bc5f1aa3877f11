"""Fixtures for the fabric and PCIe tests: fake sysfs trees and check contexts.

Loaded by this folder's test modules (`pytest_plugins`) rather than kept in a
conftest.py: a nested conftest.py takes over the module name `conftest`, from which other
areas' tests import the shared helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core.findings import Finding
from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.sweep import load_checks


@pytest.fixture
def make_ctx(tmp_path: Path) -> Callable[..., CheckContext]:
    def make(root: Path | None = None, *, path: str = "", **node: Any) -> CheckContext:
        return CheckContext(
            config=NodeConfig.model_validate(node),
            root=root or tmp_path / "root",
            env={"PATH": f"{path}:/usr/bin:/bin" if path else str(tmp_path / "emptybin")},
        )

    (tmp_path / "emptybin").mkdir()
    return make


@pytest.fixture
def run_named() -> Callable[[str, CheckContext], list[Finding]]:
    load_checks()

    def run(name: str, ctx: CheckContext) -> list[Finding]:
        findings, _ = run_check(REGISTRY[name], ctx)
        return findings

    return run


@pytest.fixture
def ib_node(tmp_path: Path) -> FakeSysfs:
    return FakeSysfs.node(tmp_path / "root", gpus=8, kind="ib", adapters=8, rate_gbps=400)
