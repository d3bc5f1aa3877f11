"""deploy/slurm/gpuvigil-preflight.sh with fake gpuvigil/scontrol/squeue on PATH."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "deploy/slurm/gpuvigil-preflight.sh"

FAILED = {
    "result": "fail",
    "report": {
        "findings": [
            {"component": "gpu:3", "code": "GPU_SDC", "status": "FAILED"},
            {"component": "nic:mlx5_2", "code": "FABRIC_PORT_DOWN", "status": "FAILED"},
            {"component": "gpu:0", "code": "X", "status": "OK"},
        ]
    },
}


@pytest.fixture
def slurm(fake_bin, tmp_path):
    log = tmp_path / "calls.log"

    def setup(*, rc: int, out: str = "", running: str = "") -> None:
        (tmp_path / "out.json").write_text(out)
        fake_bin(
            "gpuvigil",
            f'#!/bin/sh\necho "gpuvigil $*" >> {log}\ncat {tmp_path / "out.json"}\nexit {rc}\n',
        )
        fake_bin(
            "scontrol",
            f'#!/bin/sh\necho "scontrol $*" >> {log}\n'
            '[ "$1" = show ] && echo "   Reason=$FAKE_REASON [root@t]"\n'
            "exit 0\n",
        )
        fake_bin("squeue", f"#!/bin/sh\necho '{running}'\n")

    def run(**env: str) -> tuple[int, list[str]]:
        e = dict(os.environ)
        e["PATH"] = f"{fake_bin.dir}:{e['PATH']}"
        e["SLURMD_NODENAME"] = "gpu7"
        e.pop("SLURM_JOB_ID", None)
        e.update(env)
        p = subprocess.run(["bash", str(SCRIPT)], env=e, capture_output=True, text=True, timeout=30)
        calls = log.read_text().splitlines() if log.exists() else []
        return p.returncode, calls

    setup.run = run  # type: ignore[attr-defined]
    return setup


def test_pass_leaves_the_node_alone(slurm):
    slurm(rc=0, out='{"result": "pass"}')
    rc, calls = slurm.run(FAKE_REASON="maintenance by alice")
    assert rc == 0 and calls == ["gpuvigil preflight --json", "scontrol show node gpu7"]


def test_pass_resumes_a_node_this_script_drained(slurm):
    slurm(rc=0, out='{"result": "pass"}')
    rc, calls = slurm.run(FAKE_REASON="gpuvigil preflight: gpu:3 GPU_SDC")
    assert rc == 0 and calls[-1] == "scontrol update NodeName=gpu7 State=RESUME"


def test_failure_drains_with_the_problems_as_reason(slurm):
    slurm(rc=1, out=json.dumps(FAILED))
    rc, calls = slurm.run(GPUVIGIL_PREFLIGHT_MODE="quick")
    assert rc == 1
    assert calls[0] == "gpuvigil preflight --checks matmul,memory --budget-s 60 --json"
    assert calls[1] == (
        "scontrol update NodeName=gpu7 State=DRAIN Reason=gpuvigil preflight: "
        "gpu:3 GPU_SDC; nic:mlx5_2 FABRIC_PORT_DOWN"
    )


def test_could_not_run_and_garbage_still_drain(slurm):
    slurm(rc=2, out="Traceback: boom")
    rc, calls = slurm.run()
    assert rc == 1 and "could not run" in calls[-1] and calls[-1].startswith("scontrol update")


def test_busy_node_gets_only_the_passive_check(slurm):
    slurm(rc=0, out="{}", running="4242")
    rc, calls = slurm.run(FAKE_REASON="none")
    assert rc == 0 and calls[0] == "gpuvigil check --json"
    rc, calls = slurm.run(SLURM_JOB_ID="4243", FAKE_REASON="none")  # a Prolog: run it all
    assert "gpuvigil preflight --json" in calls
