"""Shared test helpers: real components are required under CI, fake binaries, the CLI.

Under `CI=true` a missing real component (a binary, a server) fails the test; elsewhere it
skips with the reason, so a developer without Slurm can still run the unit tests.
"""

from __future__ import annotations

import importlib.util
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit import SHARED_CORPUS, cli_env, gpuvigil_argv, in_ci, require, require_binary

pytest_plugins = ["realparts.fixtures"]

__all__ = ["cli_env", "gpuvigil_argv", "in_ci", "require", "require_binary"]


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run `gpuvigil ARGS...` from this checkout; returns the completed process."""

    def run(
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            gpuvigil_argv(*args),
            env=cli_env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )

    return run


@pytest.fixture
def fake_bin(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write an executable script into a fresh folder; put `fake_bin.dir` first on PATH.

    Usage: `fake_bin("nvidia-smi", "#!/bin/sh\\ncat /path/to/output\\n")`.
    """
    bindir = tmp_path / "fakebin"
    bindir.mkdir()

    def make(name: str, script: str) -> Path:
        p = bindir / name
        p.write_text(script)
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return p

    make.dir = bindir  # type: ignore[attr-defined]
    return make


@pytest.fixture
def corpus() -> Path:
    """The shared real-world corpus (../shared/corpus); skipped where it is absent."""
    require(SHARED_CORPUS.is_dir(), f"shared corpus not found at {SHARED_CORPUS}")
    return SHARED_CORPUS


@pytest.fixture
def need_torch() -> None:
    """PyTorch (the [training] extra, which `make test` installs): required under CI."""
    require(importlib.util.find_spec("torch") is not None, "torch is not installed")
