"""Fixtures of the training unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def one_rank() -> Iterator[Any]:
    """A real 1-rank gloo group: `resume.choose` broadcasts and gathers even alone, and a
    fake collective would test the fake, not the code under test."""
    dist = pytest.importorskip("torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
