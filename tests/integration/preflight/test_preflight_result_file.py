"""`gpuvigil preflight --result-file`: the verdict line the Kubernetes preflight pod leaves
in its termination log (the controller reads it from the pod's status,
clusters.k8s_preflight), and the exit status that decides; `--skip-check` for what the
pod cannot do. Real subprocesses; the pod side is tests/integration/controller."""

from __future__ import annotations

import json

import pytest

from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.platform.clusters.k8s_preflight import result_of

pytestmark = pytest.mark.usefixtures("need_torch")
QUICK = ("preflight", "--device", "cpu", "--expect-gpus", "0", "--checks", "matmul", "--json")


def as_pod(node: str, rc: int, message: str) -> dict:
    """What the node's kubelet reports for the pod that ran it."""
    return {
        "metadata": {},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Succeeded" if rc == 0 else "Failed",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": rc,
                            "finishedAt": "2026-12-01T12:00:00Z",
                            "message": message,
                        }
                    }
                }
            ],
        },
    }


def test_pass_and_fail_reach_the_controller_through_the_pods_exit(run_cli, tmp_path):
    out = tmp_path / "termination-log"
    p = run_cli(*QUICK, "--result-file", str(out), "--skip-check", "kernel_log", timeout=120)
    assert p.returncode == 0, p.stderr
    verdict = json.loads(out.read_text())
    assert verdict["result"] == "pass" and verdict["summary"] == "all checks passed"
    skipped = [f for f in json.loads(p.stdout)["report"]["findings"] if f["check"] == "kernel_log"]
    assert [f["code"] for f in skipped] == ["CHECK_DISABLED"]  # said, not silently dropped
    got = result_of(as_pod("gpu-1", p.returncode, out.read_text()), node="gpu-1")
    assert got is not None and got.passed

    fs = FakeSysfs.node(tmp_path / "root", gpus=0, kind="ib", adapters=8)
    fs.remove_adapter("mlx5_7")
    p = run_cli(
        *QUICK,
        "--result-file",
        str(out),
        "--instance-type",
        "dgx-h100",
        "--sysfs-root",
        str(fs.root),
        timeout=120,
    )
    assert p.returncode == 1, p.stderr
    got = result_of(as_pod("gpu-1", p.returncode, out.read_text()), node="gpu-1")
    assert got is not None and not got.passed and "node FABRIC_COUNT_LOW" in got.summary


def test_an_unwritable_result_file_still_exits_with_the_verdict(run_cli, tmp_path):
    p = run_cli(*QUICK, "--result-file", str(tmp_path / "no" / "such" / "dir"), timeout=120)
    assert p.returncode == 0 and "cannot write" in p.stderr
