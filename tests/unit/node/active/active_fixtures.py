"""Fixtures for the active checks on the CPU: real torch compute, faults by wrapping it.

Loaded by this folder's test modules (`pytest_plugins`) rather than kept in a
conftest.py: a nested conftest.py takes over the module name `conftest`, from which other
areas' tests import the shared helpers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuvigil.node.active.config import ActiveConfig


@pytest.fixture
def cpu_ops(need_torch: None) -> Iterator[Callable[..., Any]]:
    """Two virtual CPU devices, optionally wrapped by a `gpuvigil.fakes.active` injector."""
    import torch

    from gpuvigil.node.active.worker import build_ops

    def make(fault: str | None = None, devices: int = 2) -> Any:
        wrapper = f"gpuvigil.fakes.active:{fault}" if fault else None
        return build_ops("cpu", cpu_devices=devices, wrapper=wrapper)

    # The CPU ops take the process to one torch thread (their worker's own process in
    # production); here the process is pytest's, so give the other tests theirs back.
    threads = torch.get_num_threads()
    yield make
    torch.set_num_threads(threads)


@pytest.fixture
def small() -> ActiveConfig:
    return ActiveConfig(
        matmul_size=32,
        load_size=48,
        load_s=0.5,
        transfer_bytes=1 << 20,
        memory_bytes_cpu=1 << 20,
        allreduce_bytes=1 << 16,
        min_fraction_of_median=0.3,
    )  # CPU timing noise on a shared box
