"""Shared test helpers: real components are required under CI, fake binaries, the CLI.

Under `CI=true` a missing real component (a binary, a server) fails the test; elsewhere it
skips with the reason, so a developer without Slurm can still run the unit tests.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ["realparts.fixtures"]

SRC = Path(__file__).resolve().parents[1] / "src"
SHARED_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip outside CI, fail under CI: a missing real component is never a silent pass."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"required component missing under CI: {reason}")
    pytest.skip(reason)


def require_binary(name: str) -> str:
    path = shutil.which(name)
    require(path is not None, f"{name} not installed (make test installs it)")
    assert path is not None
    return path


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for running this checkout's gpuvigil in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if extra:
        env.update(extra)
    return env


def gpuvigil_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuvigil", *args]


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
