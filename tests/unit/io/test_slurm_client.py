"""The one Slurm client (`io.slurm_client`): a call's own limit, and what a failure is.
The tools are real executables in a temp folder (the real Slurm runs in the integration
tests)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuvigil.io.slurm_client import SlurmClient, SlurmError


def tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_a_call_may_only_shorten_its_limit(tmp_path: Path) -> None:
    tool(tmp_path, "scontrol", "sleep 30")
    client = SlurmClient(bin_dir=str(tmp_path), timeout_s=20.0)
    started = time.monotonic()
    with pytest.raises(SlurmError) as e:
        client.run("scontrol", "update", "NodeName=n1", "State=DRAIN", timeout_s=0.5)
    assert e.value.kind == "failed" and time.monotonic() - started < 10
    assert client.calls["scontrol update"] == 1
    tool(tmp_path, "sinfo", "echo ok")
    assert client.run("sinfo", timeout_s=999.0) == "ok\n"  # never longer than the client's


def test_refused_and_missing_are_not_retried_failures(tmp_path: Path) -> None:
    tool(tmp_path, "scontrol", "echo 'Invalid node name specified' >&2; exit 1")
    client = SlurmClient(bin_dir=str(tmp_path))
    with pytest.raises(SlurmError) as e:
        client.run("scontrol", "show", "node", "nope")
    assert e.value.kind == "refused"
    with pytest.raises(SlurmError) as e:
        client.run("squeue")
    assert e.value.kind == "missing"
