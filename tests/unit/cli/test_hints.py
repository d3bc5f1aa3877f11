"""Hints name the flag that works, and following one makes its problem go away.

On a machine without an NVIDIA driver (a PATH without nvidia-smi; NVML's library absent),
`check` suggests `--expect-gpus 0`, and `preflight`, whose active checks need CUDA,
suggests `--device cpu` (it used to suggest `--expect-gpus 0`, which does not help it).
Where a driver and CUDA are present there is nothing to hint, and the tests skip.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvigil import cli


@pytest.fixture
def no_driver(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    cfg = tmp_path / "gpuvigil.yaml"
    cfg.write_text("node: {}\n")
    empty = tmp_path / "bin"
    empty.mkdir()
    return cfg, {"PATH": str(empty), "COLUMNS": "120"}


def run(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(cli.app, list(args), env=env)
    assert "Traceback" not in result.output, result.output
    return result.output


def hinted(out: str) -> list[str]:
    text = " ".join(out.split())  # the console wraps the line
    m = re.search(r"on a machine without GPUs run with ((?:--[\w-]+ \w+ ?)+)\.", text)
    assert m, out[-800:]
    return m.group(1).split()


def test_check_hint_works(no_driver) -> None:
    cfg, env = no_driver
    out = run(env, "check", "--config", str(cfg))
    if "DRIVER_UNAVAILABLE" not in out:
        pytest.skip("an NVIDIA driver answers here: check needs no hint")
    flags = hinted(out)
    assert flags == ["--expect-gpus", "0"]
    assert "DRIVER_UNAVAILABLE" not in run(env, "check", "--config", str(cfg), *flags)


@pytest.mark.usefixtures("need_torch")
def test_preflight_hint_works(no_driver) -> None:
    cfg, env = no_driver
    base = ("preflight", "--config", str(cfg), "--expect-gpus", "0", "--checks", "matmul")
    out = run(env, *base)
    if "DRIVER_UNAVAILABLE" not in out:
        pytest.skip("CUDA is available here: preflight needs no hint")
    flags = hinted(out)
    assert flags == ["--device", "cpu"]
    assert "DRIVER_UNAVAILABLE" not in run(env, *base, *flags)
