# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""The controller's manifests against the real API server: they apply (server-side dry run
of everything, then the RBAC for real), and the controller does its whole job with nothing
but the ServiceAccount's permissions (impersonated)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FATAL, agent, kube_cluster  # noqa: F401  (fixtures)

from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
from gpuvigil.platform.clusters.settings import KubernetesSettings
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State

pytestmark = pytest.mark.realparts
DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "controller"
SA = "system:serviceaccount:gpuvigil:gpuvigil-controller"


@pytest.fixture(scope="module")
def deployed(kube: Any) -> None:
    kube.kubectl("create", "namespace", "gpuvigil")
    dry = kube.kubectl("apply", "-k", str(DEPLOY), "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    rbac = kube.kubectl(
        "apply",
        "-f",
        str(DEPLOY / "rbac.yaml"),
        "-f",
        str(DEPLOY / "serviceaccount.yaml"),
        "-n",
        "gpuvigil",
    )
    assert rbac.returncode == 0, rbac.stderr


def test_rbac_allows_what_it_uses_and_nothing_more(kube, deployed) -> None:  # type: ignore[no-untyped-def]
    def can(verb: str, res: str, *args: str) -> bool:
        res, _, sub = res.partition("/")
        extra = [f"--subresource={sub}"] if sub else []
        out = kube.kubectl("auth", "can-i", verb, res, *extra, *args, f"--as={SA}")
        return out.stdout.strip() == "yes"

    for verb, res in [
        ("list", "nodes"),
        ("patch", "nodes"),
        ("delete", "nodes"),
        ("list", "pods"),
        ("create", "pods/eviction"),
        ("patch", "pods/status"),
        ("create", "events"),
    ]:
        assert can(verb, res, "-A"), (verb, res)
    assert can("update", "leases", "-n", "gpuvigil")
    assert can("delete", "pods", "-n", "gpuvigil")  # re-validation: the preflight pod
    # the serving gate's make-before-break (docs/serving.md): a mark annotation on the
    # workload, the HPA's floor, then the Scale subresource; never more of a workload
    for verb, res in [
        ("patch", "deployments"),
        ("patch", "deployments/scale"),
        ("patch", "horizontalpodautoscalers"),
    ]:
        assert can(verb, res, "-A"), (verb, res)
    for verb, res in [
        ("list", "secrets"),
        ("create", "pods"),
        ("update", "leases"),
        ("create", "deployments"),
        ("update", "deployments"),
        ("delete", "deployments"),
    ]:
        assert not can(verb, res, "-n", "default"), (verb, res)


def test_the_controller_works_with_only_its_service_account(kube, deployed, agent) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    ns = kube.namespace()
    kube.create_running_pod(node, namespace=ns)
    agent.publish(node, FATAL)
    api = kube.api_client()
    api.set_default_header("Impersonate-User", SA)
    cluster = KubernetesCluster(
        KubernetesSettings(
            node_selector=f"fleet={tag}", eviction_grace_s=0, pool_gpus={"default": 8}
        ),
        api_client=api,
    )
    cfg = ControllerConfig(
        policy=PolicyConfig(fatal_grace_s=0),  # drain at once: this test is about RBAC
        safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
    )
    ctl = Controller(cluster, config=cfg)
    for _ in range(3):
        result = ctl.reconcile()
        assert not result.errors, result.errors
    assert cluster.get_node(node).record.state is State.REMEDIATING
