"""One node's credentials cannot act on another node (docs/security.md), tried on the real
kube-apiserver 1.20.2 with the shipped manifests: as the agent's account, as the preflight
pod's account (impersonated, `--as`), and as a node's own identity (the default deploy's:
Node authorizer + NodeRestriction), against a victim node whose real agent process
runs, with a person's cordon and gpuvigil's block on it.

Every cross-node act is refused by the API server, or written and then ignored by the
victim's agent (it runs nothing, answers nothing, counts the rejection); the cordon and the
block stay. A request the controller really sent is acted on (the test can fail)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.core.findings import Action
from gpuvigil.core.signing import sig_annotation

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
REPO = Path(__file__).resolve().parents[3]
AGENT = "system:serviceaccount:gpuvigil:gpuvigil-agent"
PREFLIGHT = "system:serviceaccount:gpuvigil:gpuvigil-preflight"


@pytest.fixture(scope="module")
def shipped(kube):
    """The service-account overlay (the agent talks as its ServiceAccount, which any node's
    agent holds) rendered and applied with the real kubectl: the weaker deploy, where
    signatures are what protect requests. The default deploy (the agent as its node) is
    tried in test_node_identity_kubernetes.py."""
    rendered = kube.kustomize(REPO / "deploy/kubernetes/overlays/service-account")
    applied = kube.kubectl("apply", "-f", "-", input=rendered)
    assert applied.returncode == 0, applied.stderr
    kube.ensure_preflight_template()
    return rendered


def impersonated(kube, user: str, *groups: str):
    from kubernetes import client

    api = kube.api_client()
    api.set_default_header("Impersonate-User", user)
    for g in groups:  # the client sends one header value; enough for system:nodes
        api.set_default_header("Impersonate-Group", g)
    return client.CoreV1Api(api)


def refused(call) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        call()
    except ApiException as e:
        return e.status == 403
    return False


def status_patch(v1, node: str, annotations: dict[str, str]):
    return lambda: v1.patch_node_status(node, {"metadata": {"annotations": annotations}})


def test_no_cross_node_act_succeeds(shipped, kube, start_agent, tmp_path, fake_bin):
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings

    attacker, victim = kube.create_node(), kube.create_node()
    admin = kube.core()
    # A person cordoned the victim; gpuvigil blocked it.
    admin.patch_node(
        victim,
        {
            "spec": {
                "unschedulable": True,
                "taints": [{"key": wire.UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}],
            }
        },
    )
    controller = KubernetesCluster(KubernetesSettings(), api_client=kube.api_client())
    controller.signer()  # as at controller start: key Secret + public key ConfigMap
    trusted = tmp_path / "controller.pub"
    trusted.write_text(
        admin.read_namespaced_config_map("gpuvigil-trust", "gpuvigil").data["controller.pub"]
    )

    # The victim's real agent, as its service account, trusting the controller's key.
    acted = tmp_path / "acted.log"
    fake_bin("nvidia-smi", f'#!/bin/sh\necho reset "$@" >> {acted}\n')
    fake_bin("reboot-now", f"#!/bin/sh\necho reboot >> {acted}\n")
    sa_cfg = agent_helpers.sa_kubeconfig(kube, tmp_path / "agent.kubeconfig", sa="gpuvigil-agent")
    victim_agent = agent_helpers.start_kube_agent(
        start_agent, victim, kubeconfig=sa_cfg, trust=trusted, poll_s=0.3,
        remediation={"reboot_argv": ["reboot-now"], "boot_id_path": str(tmp_path / "boot_id")},
    )  # fmt: skip
    wait_until(
        lambda: wire.HEALTH_ANNOTATION in (admin.read_node(victim).metadata.annotations or {}),
        20,
        "the victim agent's summary",
    )

    # 1. As the agent's account (every node's agent has it).
    def can(*args: str) -> str:
        return kube.kubectl("auth", "can-i", *args, f"--as={AGENT}").stdout.strip()

    as_agent = impersonated(kube, AGENT)
    out = kube.kubectl("taint", "nodes", victim, f"{wire.UNHEALTHY_TAINT}-", f"--as={AGENT}")
    assert out.returncode != 0 and "forbidden" in out.stderr.lower(), out  # lift the block
    out = kube.kubectl("uncordon", victim, f"--as={AGENT}")  # exits 0 even when refused
    assert 'cannot patch resource "nodes"' in out.stderr, out  # lift the cordon
    out = kube.kubectl(
        "annotate",
        "node",
        victim,
        "--overwrite",
        f"--as={AGENT}",
        f'{wire.REQUEST_ANNOTATION}={{"id":"x","action":"REBOOT"}}',
    )
    assert out.returncode != 0 and "forbidden" in out.stderr.lower(), out
    assert refused(lambda: as_agent.patch_node(victim, {"spec": {"taints": []}}))
    assert refused(lambda: as_agent.delete_node(victim))
    assert can("create", "pods", "-n", "gpuvigil") == "no"  # cannot start a "preflight"
    assert can("patch", "pods", "--subresource=status", "-n", "gpuvigil") == "no"
    assert can("get", "secrets", "-n", "gpuvigil") == "no"  # cannot read the signing key
    assert can("update", "configmaps", "-n", "gpuvigil") == "no"  # nor replace the trust

    # The status subresource carries annotations on 1.20, so these writes land, and the
    # victim's agent must ignore them: a forged request, a genuine request for another
    # node copied over, a forged release.
    controller.request(attacker, action=Action.REBOOT, request_id="for-attacker", gpus=[])
    theirs = admin.read_node(attacker).metadata.annotations
    forged = {
        "id": "forged",
        "action": "REBOOT",
        "gpus": [],
        "at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
    }
    for ann in (
        {wire.REQUEST_ANNOTATION: json.dumps(forged)},
        {
            wire.REQUEST_ANNOTATION: json.dumps(forged),
            sig_annotation(wire.REQUEST_ANNOTATION): "junk.c2ln",
        },
        {k: theirs[k] for k in (wire.REQUEST_ANNOTATION, sig_annotation(wire.REQUEST_ANNOTATION))},
        {wire.RELEASED_ANNOTATION: "2099-01-01T00:00:00+00:00"},
    ):
        status_patch(as_agent, victim, ann)()  # accepted by the API server ...
        time.sleep(1.5)  # ... several publishes of the victim's agent (poll 0.3 s)
    metrics = victim_agent.metrics()
    assert not acted.exists(), acted.read_text()  # ... and never acted on
    victim_ann = admin.read_node(victim).metadata.annotations or {}
    assert wire.RESULT_ANNOTATION not in victim_ann  # nor answered
    assert 'kind="remediation-request",reason="not signed"' in metrics
    assert 'kind="remediation-request",reason="bad signature"' in metrics
    assert 'kind="released-at",reason="not signed"' in metrics

    # 2. As the preflight pod's account: nothing at all.
    as_preflight = impersonated(kube, PREFLIGHT)
    assert refused(lambda: as_preflight.read_node(victim))
    assert refused(status_patch(as_preflight, victim, {"gpuvigil.io/preflight": "pass"}))
    assert refused(lambda: as_preflight.patch_node(victim, {"spec": {"unschedulable": False}}))
    assert refused(
        lambda: as_preflight.create_namespaced_pod(
            "gpuvigil",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "fake-pass"},
                "spec": {"nodeName": victim, "containers": [{"name": "c", "image": "x"}]},
            },
        )
    )

    # 3. As the attacker node's own identity (the default deploy's, node-identity/):
    # NodeRestriction refuses every write to another Node, status and metadata alike.
    as_node = impersonated(kube, f"system:node:{attacker}", "system:nodes")
    assert refused(status_patch(as_node, victim, {wire.HEALTH_ANNOTATION: "{}"}))
    assert refused(
        lambda: as_node.patch_node(
            victim, {"metadata": {"labels": {"gpuvigil.io/exclude": "true"}}}
        )
    )
    assert refused(lambda: as_node.patch_node(victim, {"spec": {"unschedulable": False}}))
    status_patch(as_node, attacker, {"gpuvigil.io/own": "fine"})()  # its own Node: allowed

    # The person's cordon and gpuvigil's block are still there.
    spec = admin.read_node(victim).spec
    assert spec.unschedulable is True
    assert [t.key for t in spec.taints or []] == [wire.UNHEALTHY_TAINT]

    # And the controller's own request is acted on once (so the checks above can fail).
    controller.request(victim, action=Action.RESET_GPU, request_id="real-1", gpus=[1])
    wait_until(
        lambda: acted.exists() and "reset --gpu-reset -i 1" in acted.read_text(),
        15,
        "the genuine reset",
    )
    assert acted.read_text().splitlines() == ["reset --gpu-reset -i 1"]
