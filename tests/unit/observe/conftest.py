"""Helpers for the observe tests: build events tersely."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuvigil.core.events import Event


def make_event(
    ts: float,
    kind: str,
    node: str | None = None,
    job: str | None = None,
    source: str = "test",
    **data: Any,
) -> Event:
    return Event(ts=ts, kind=kind, source=source, node=node, job=job, data=data)


@pytest.fixture
def ev() -> Callable[..., Event]:
    """`ev(ts, kind, node=..., job=..., **data)` -> Event."""
    return make_event
