"""Fixtures of the agent's unit tests (a plain module, not a conftest.py: nested conftest
modules all import as `conftest` and shadow the root one). Take them with
`register = agent_unit_fixtures.register`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gpuvigil.node import checks


@pytest.fixture
def register() -> Iterator[Callable[..., checks.CheckSpec]]:
    """Register a check through `@checks.check` for this test; removed afterwards."""
    names: list[str] = []

    def add(name: str, fn: checks.CheckFn, **kw: object) -> checks.CheckSpec:
        kw.setdefault("group", "fast")
        kw.setdefault("interval_s", 1.0)
        kw.setdefault("timeout_s", 0.5)
        checks.check(name, **kw)(fn)  # type: ignore[arg-type]
        names.append(name)
        return checks.REGISTRY[name]

    yield add
    for n in names:
        checks.REGISTRY.pop(n, None)
