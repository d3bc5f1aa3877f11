"""Fixtures for the active checks on the CPU: real torch compute, faults by wrapping it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuvigil.node.active.config import ActiveConfig

pytest.importorskip("torch")  # the [training] extra; installed by `make test`


@pytest.fixture
def cpu_ops() -> Callable[[str | None], Any]:
    """Two virtual CPU devices, optionally wrapped by a `gpuvigil.fakes.active` injector."""
    from gpuvigil.node.active.worker import build_ops

    def make(fault: str | None = None, devices: int = 2) -> Any:
        wrapper = f"gpuvigil.fakes.active:{fault}" if fault else None
        return build_ops("cpu", cpu_devices=devices, wrapper=wrapper)

    return make


@pytest.fixture
def small() -> ActiveConfig:
    return ActiveConfig(matmul_size=32, load_size=48, load_s=0.5, transfer_bytes=1 << 20,
                        memory_bytes_cpu=1 << 20, allreduce_bytes=1 << 16)
