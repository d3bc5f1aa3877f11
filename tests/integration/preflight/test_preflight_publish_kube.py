"""`gpuvigil preflight --publish kubernetes` against a real kube-apiserver; the shipped
preflight manifests pass the server's dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuvigil.core.wire import PREFLIGHT_ANNOTATION, UNVALIDATED_TAINT
from gpuvigil.fakes.sysfs import FakeSysfs

pytestmark = [pytest.mark.realparts, pytest.mark.usefixtures("need_torch")]
DEPLOY = Path(__file__).resolve().parents[3] / "deploy/kubernetes/preflight"
QUICK = (
    "preflight",
    "--device",
    "cpu",
    "--expect-gpus",
    "0",
    "--checks",
    "matmul",
    "--json",
    "--publish",
    "kubernetes",
)


def annotation(kube, node: str) -> dict:
    n = kube.core().read_node(node)
    return json.loads(n.metadata.annotations[PREFLIGHT_ANNOTATION])


def test_pass_and_fail_are_published_on_the_node(kube, run_cli, tmp_path):
    node = kube.create_node(taints=[{"key": UNVALIDATED_TAINT, "effect": "NoSchedule"}])
    p = run_cli(*QUICK, "--node-name", node, "--kubeconfig", str(kube.kubeconfig), timeout=90)
    assert p.returncode == 0, p.stderr
    got = annotation(kube, node)
    assert got["result"] == "pass" and got["summary"] == "all checks passed" and got["at"]
    # Preflight never lifts the taint itself: that is the controller's decision.
    taints = [t.key for t in kube.core().read_node(node).spec.taints or []]
    assert UNVALIDATED_TAINT in taints

    fs = FakeSysfs.node(tmp_path / "root", gpus=0, kind="ib", adapters=8)
    fs.remove_adapter("mlx5_7")
    p = run_cli(
        *QUICK,
        "--node-name",
        node,
        "--kubeconfig",
        str(kube.kubeconfig),
        "--instance-type",
        "dgx-h100",
        "--sysfs-root",
        str(fs.root),
        timeout=90,
    )
    assert p.returncode == 1, p.stderr
    got = annotation(kube, node)
    assert got["result"] == "fail" and "node FABRIC_COUNT_LOW" in got["summary"]


def test_publish_failure_is_exit_2(kube, run_cli):
    p = run_cli(
        *QUICK, "--node-name", "no-such-node", "--kubeconfig", str(kube.kubeconfig), timeout=90
    )
    assert p.returncode == 2
    assert "cannot annotate node 'no-such-node'" in p.stderr
    assert p.stdout == ""  # found by the server's dry run before any check ran


def test_manifests_pass_server_dry_run(kube):
    kube.kubectl("create", "namespace", "gpuvigil")  # may exist from another test
    p = kube.kubectl("apply", "--dry-run=server", "-k", str(DEPLOY))
    assert p.returncode == 0, p.stderr
    assert "daemonset.apps/gpuvigil-preflight" in p.stdout
