"""The default deploy on the real kube-apiserver 1.20.2 (Node authorizer + NodeRestriction,
as kubeadm, EKS, GKE and AKS run it): the agent talks as its node (deploy/kubernetes
node-identity/), and nothing node A's credentials can write changes what the controller
reads about node B: its health, its conditions, its state record, its labels, the GPU
count its validation expects. Node A's credentials are its agent's (`system:node:A`, the
kubelet's identity) and its DaemonSet pod's ServiceAccount, both tried with `kubectl --as`
and the client. The victim's real agent runs as its own node, publishes and acts on the
controller's signed request (so the agent works with that identity and the test can
fail); the attacker may still write its own Node (so the refusals are the API server's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.core.findings import Action, Status, utcnow
from gpuvigil.core.wire import FindingSummary, HealthSummary
from realparts.kube import NODE_IDENTITIES

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
REPO = Path(__file__).resolve().parents[3]
AGENT_SA = "system:serviceaccount:gpuvigil:gpuvigil-agent"
FORGED = HealthSummary(
    generated_at=utcnow(),
    status=Status.FAILED,
    findings=[
        FindingSummary(
            code="XID_79",
            component="gpu:0",
            status=Status.FAILED,
            action=Action.REBOOT,
            fatal=True,
            check="xid",
        )
    ],
).model_dump_json()


@pytest.fixture(scope="module")
def default_deploy(kube: Any) -> None:
    """`kubectl apply -k deploy/kubernetes`, as on a fresh cluster (another module may have
    applied the service-account overlay's binding into this shared API server first)."""
    applied = kube.kubectl("apply", "-k", str(REPO / "deploy/kubernetes"))
    assert applied.returncode == 0, applied.stderr
    rendered = kube.kustomize(REPO / "deploy/kubernetes")
    assert "name: gpuvigil-agent\nroleRef" not in rendered  # no binding for the agent's SA
    kube.kubectl("delete", "clusterrolebinding", "gpuvigil-agent", "--ignore-not-found")
    kube.ensure_preflight_template()


def fresh_node(kube: Any, name: str) -> str:
    from kubernetes.client.exceptions import ApiException

    try:
        kube.core().delete_node(name)
    except ApiException as e:
        assert e.status == 404, e
    return kube.create_node(name, labels={"nvidia.com/gpu.present": "true"})


def refused(call: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as e:
        return e.status == 403
    return False


def as_user(kube: Any, user: str, group: str | None = None) -> Any:
    from kubernetes import client

    api = kube.api_client()
    api.set_default_header("Impersonate-User", user)
    if group:
        api.set_default_header("Impersonate-Group", group)
    return client.CoreV1Api(api)


def what_the_controller_reads(kube: Any, controller: Any, node: str) -> dict[str, Any]:
    view = controller.get_node(node)
    raw = kube.core().read_node(node)
    return {
        "codes": sorted(f.code for f in view.health.findings) if view.health else None,
        "record": view.record,
        "labels": view.labels,
        "pool": view.pool,
        "allocatable": raw.status.allocatable,
        "conditions": {c.type: c.status for c in raw.status.conditions or []},
        "agent_key": (raw.metadata.annotations or {}).get("gpuvigil.io/agent-key"),
    }


def test_node_a_changes_nothing_the_controller_reads_about_node_b(  # type: ignore[no-untyped-def]
    default_deploy, kube, start_agent, tmp_path, fake_bin
) -> None:
    from kubernetes.client.exceptions import ApiException

    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings
    from gpuvigil.platform.state import Record, State

    attacker, victim = (fresh_node(kube, n) for n in NODE_IDENTITIES[:2])
    controller = KubernetesCluster(
        KubernetesSettings(watch=False, pool_gpus={"default": 8}), api_client=kube.api_client()
    )
    trusted = tmp_path / "controller.pub"
    controller.signer()  # as at controller start: key Secret + public key ConfigMap
    trusted.write_text(
        kube.core().read_namespaced_config_map("gpuvigil-trust", "gpuvigil").data["controller.pub"]
    )
    acted = tmp_path / "acted.log"
    fake_bin("nvidia-smi", f'#!/bin/sh\necho reset "$@" >> {acted}\n')
    # The victim's agent, as the default deploy runs it: with its node's identity.
    victim_agent = agent_helpers.start_kube_agent(
        start_agent, victim, kubeconfig=kube.node_kubeconfig(victim), trust=trusted,
        poll_s=0.3, remediation={"boot_id_path": str(tmp_path / "boot_id")},
    )  # fmt: skip
    ann = lambda: kube.core().read_node(victim).metadata.annotations or {}  # noqa: E731
    wait_until(lambda: wire.HEALTH_ANNOTATION in ann(), 20, "the victim agent's summary")
    controller.store(victim, Record(state=State.HEALTHY))
    before = what_the_controller_reads(kube, controller, victim)
    assert before["codes"] == [] and before["record"].state is State.HEALTHY

    # Every write node A's credentials could make about B: health, its signature and key,
    # the controller's record, conditions (Ready), allocatable, labels, the spec.
    zero = {"cpu": "1", "memory": "1Gi", "pods": "1", "nvidia.com/gpu": "0"}
    writes: list[dict[str, Any]] = [
        {"metadata": {"annotations": {wire.HEALTH_ANNOTATION: FORGED}}},
        {"metadata": {"annotations": {"gpuvigil.io/state": json.dumps({"v": 1})}}},
        {"metadata": {"annotations": {"gpuvigil.io/agent-key": "forged"}}},
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "x"}]}},
        {"status": {"allocatable": zero, "capacity": zero}},
        {
            "metadata": {
                "labels": {
                    "gpuvigil.io/exclude": "true",
                    "gpuvigil.io/pool": "other",
                    "node.kubernetes.io/instance-type": "cpu.tiny",
                    "nvidia.com/gpu.present": "false",
                }
            }
        },
    ]
    for user, group in ((f"system:node:{attacker}", "system:nodes"), (AGENT_SA, None)):
        v1 = as_user(kube, user, group)
        for body in writes:
            assert refused(lambda v=v1, b=body: v.patch_node_status(victim, b)), (user, body)
            assert refused(lambda v=v1, b=body: v.patch_node(victim, b)), (user, body)
        assert refused(lambda v=v1: v.delete_node(victim))
        as_flags = [f"--as={user}"] + ([f"--as-group={group}"] if group else [])
        for cmd in (
            ["label", "node", victim, "gpuvigil.io/exclude=true"],
            ["annotate", "node", victim, "--overwrite", f"{wire.HEALTH_ANNOTATION}={FORGED}"],
            ["taint", "nodes", victim, "gpuvigil.io/x=1:NoSchedule"],
        ):
            out = kube.kubectl(*cmd, *as_flags)
            assert out.returncode != 0 and "forbidden" in out.stderr.lower(), (user, cmd, out)
    # ... while its own Node takes the same writes: the refusals are about B.
    own = as_user(kube, f"system:node:{attacker}", "system:nodes")
    own.patch_node_status(attacker, {"status": {"allocatable": zero}})
    own.patch_node_status(attacker, {"metadata": {"annotations": {wire.HEALTH_ANNOTATION: "{}"}}})
    with pytest.raises(ApiException):  # its own taints stay the controller's
        own.patch_node(attacker, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})

    after = what_the_controller_reads(kube, controller, victim)
    assert {k: v for k, v in after.items() if k != "conditions"} == {
        k: v for k, v in before.items() if k != "conditions"
    }
    assert after["conditions"].get("Ready") == "True"
    assert controller.revalidate(victim, since=utcnow()) == 1  # the pool's 8 GPUs
    (pod,) = (
        kube.core()
        .list_namespaced_pod("gpuvigil", label_selector=f"gpuvigil.io/node={victim}")
        .items
    )
    assert pod.spec.containers[0].args[-2:] == ["--expect-gpus", "8"]

    # The victim's agent, as its node, still acts on the controller's request and answers.
    controller.request(victim, action=Action.RESET_GPU, request_id="real-1", gpus=[1])
    wait_until(
        lambda: acted.exists() and "reset --gpu-reset -i 1" in acted.read_text(),
        15,
        "the genuine reset",
    )
    wait_until(lambda: wire.RESULT_ANNOTATION in ann(), 10, "the agent's result")
    assert "forbidden" not in victim_agent.log().lower(), victim_agent.log()[-2000:]
