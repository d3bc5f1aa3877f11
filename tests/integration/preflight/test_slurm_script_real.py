"""deploy/slurm/gpuvigil-preflight.sh against real Slurm 22.05 (real scontrol/squeue); the
gpuvigil it calls is a fake that prints a recorded result (no GPU here)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.realparts
SCRIPT = Path(__file__).resolve().parents[3] / "deploy/slurm/gpuvigil-preflight.sh"
FAIL = {
    "result": "fail",
    "report": {
        "findings": [{"component": "gpu:5", "code": "GPU_MEMORY_FAULT", "status": "FAILED"}]
    },
}


def run_script(slurm, fake_bin, tmp_path, *, rc: int, out: dict, node: str) -> int:
    (tmp_path / "out.json").write_text(json.dumps(out))
    fake_bin("gpuvigil", f"#!/bin/sh\ncat {tmp_path / 'out.json'}\nexit {rc}\n")
    env = slurm.env()
    env["PATH"] = f"{fake_bin.dir}:{env['PATH']}"
    env["SLURMD_NODENAME"] = node
    p = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    return p.returncode


def reason(slurm, node: str) -> str:
    return str(slurm.nodes()[node].get("reason", ""))


def test_drain_on_failure_resume_on_pass(slurm, fake_bin, tmp_path):
    assert run_script(slurm, fake_bin, tmp_path, rc=1, out=FAIL, node="gpu2") == 1
    assert "DRAIN" in slurm.node_state("gpu2")
    assert reason(slurm, "gpu2") == "gpuvigil preflight: gpu:5 GPU_MEMORY_FAULT"
    assert run_script(slurm, fake_bin, tmp_path, rc=0, out={"result": "pass"}, node="gpu2") == 0
    state = slurm.node_state("gpu2")  # IDLE (+NOT_RESPONDING while a slurmd settles)
    assert state.startswith("IDLE") and "DRAIN" not in state


def test_someone_elses_drain_is_left_alone(slurm, fake_bin, tmp_path):
    slurm.run("scontrol", "update", "NodeName=gpu3", "State=DRAIN", "Reason=bad fan, alice")
    assert run_script(slurm, fake_bin, tmp_path, rc=0, out={"result": "pass"}, node="gpu3") == 0
    assert "DRAIN" in slurm.node_state("gpu3")
    assert reason(slurm, "gpu3") == "bad fan, alice"
