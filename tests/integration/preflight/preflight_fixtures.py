"""Fixtures of the preflight integration tests.

Loaded by this folder's test modules (`pytest_plugins`) rather than kept in a
conftest.py: a nested conftest.py takes over the module name `conftest`, from which other
areas' tests import the shared helpers.
"""

from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.fixture
def need_torch() -> None:
    """PyTorch (the [training] extra, which `make test` installs): required under CI."""
    # As tests/conftest.py's require(), which cannot be imported by name reliably here
    # (another folder's conftest.py may hold the module name `conftest` by then).
    if importlib.util.find_spec("torch") is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("required component missing under CI: torch is not installed")
        pytest.skip("torch is not installed")
