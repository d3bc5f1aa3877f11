"""Test helpers importable from any test module: `from testkit import require, cli_env`.

Kept out of conftest.py because nested conftest files all import as the module
`conftest`, so `from conftest import ...` can pick the wrong one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

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


def cli_flags(command: str) -> list[str]:
    """Every long option of `gpuvigil COMMAND`, read from the command itself (so a test
    that checks each one is documented cannot miss a new one)."""
    from gpuvigil.cli import load

    return [o for p in load(command).params for o in p.opts if o.startswith("--")]


def lightning_example() -> ModuleType:
    """examples/train_lightning.py as a module (the Lightning tests train the example users
    copy); skipped, or failed under CI, without pytorch-lightning."""
    require(
        importlib.util.find_spec("pytorch_lightning") is not None,
        "pytorch-lightning (gpuvigil[integrations])",
    )
    path = SRC.parent / "examples" / "train_lightning.py"
    spec = importlib.util.spec_from_file_location("example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example
