# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""After a GPU reset the node validates again: the controller deletes the node's preflight
pod (the DaemonSet would start a fresh one) once per validation, also across a controller
restart, and a new preflight pass brings the node back. Real kube-apiserver 1.20.2, no
kubelets: the test plays the agent and the DaemonSet."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from ctl_helpers import FATAL, agent, kube_cluster  # noqa: F401  (fixtures)

from gpuvigil.core import wire
from gpuvigil.core.findings import utcnow
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State, decode_record

pytestmark = pytest.mark.realparts
LABELS = {"app.kubernetes.io/name": "gpuvigil-preflight"}  # deploy/kubernetes/preflight
CFG = ControllerConfig(
    policy=PolicyConfig(fatal_grace_s=0),  # drain at once: these tests are about preflight
    safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
)


def record(kube: Any, node: str) -> Any:
    ann = kube.core().read_node(node).metadata.annotations or {}
    return decode_record(ann.get("gpuvigil.io/state"))


def answer_requests(kube: Any, node: str) -> None:
    """The agent: does the requested reset, says so, publishes a clean summary."""
    v1 = kube.core()
    ann = v1.read_node(node).metadata.annotations or {}
    req = json.loads(ann.get(wire.REQUEST_ANNOTATION) or "null")
    res = json.loads(ann.get(wire.RESULT_ANNOTATION) or "null")
    if req and (not res or res.get("id") != req["id"]):
        done = {"id": req["id"], "result": "succeeded", "at": utcnow().isoformat()}
        v1.patch_node(
            node, {"metadata": {"annotations": {wire.RESULT_ANNOTATION: json.dumps(done)}}}
        )
        agent_publish_clean(v1, node)


def agent_publish_clean(v1: Any, node: str) -> None:
    from ctl_helpers import health

    v1.patch_node(node, {"metadata": {"annotations": {wire.HEALTH_ANNOTATION: health()}}})


def daemon_pod(kube: Any, ns: str, node: str, labels: dict[str, str]) -> str:
    """A pod of a DaemonSet on `node`, as the DaemonSet controller would create it (a drain
    leaves DaemonSet pods alone; only `revalidate` may delete the preflight one)."""
    from kubernetes import client

    name = labels.get("app.kubernetes.io/name", "ds")
    apps = client.AppsV1Api(kube.api_client())
    try:
        ds = apps.read_namespaced_daemon_set(name, ns)
    except client.ApiException:
        ds = apps.create_namespaced_daemon_set(
            ns,
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                    },
                },
            },
        )
    pod = kube.create_running_pod(node, namespace=ns, labels=labels)
    owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": ds.metadata.uid}
    kube.core().patch_namespaced_pod(pod, ns, {"metadata": {"ownerReferences": [owner]}})
    return pod


def preflight_pods(kube: Any, ns: str, node: str) -> list[Any]:
    return kube.core().list_namespaced_pod(ns, field_selector=f"spec.nodeName={node}").items


def test_reset_then_preflight_pod_deleted_once_and_a_new_pass_returns_the_node(  # type: ignore[no-untyped-def]
    kube, kube_cluster, agent
) -> None:
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    ns = kube.namespace("gpuvigil")
    old_pod = daemon_pod(kube, ns, node, LABELS)
    other = daemon_pod(kube, ns, node, {"app.kubernetes.io/name": "gpuvigil-agent"})
    pf = {"result": "pass", "at": utcnow().isoformat(), "summary": "at join"}
    kube.core().patch_node(
        node, {"metadata": {"annotations": {wire.PREFLIGHT_ANNOTATION: json.dumps(pf)}}}
    )
    time.sleep(1.1)  # creationTimestamp has whole seconds: the episode starts a second later
    agent.publish(node, FATAL)
    settings = {"node_selector": f"fleet={tag}", "preflight_namespace": ns}
    c = kube_cluster(**settings)
    ctl = Controller(c, config=CFG)
    seen = []
    for _ in range(10):
        ctl.reconcile()
        rec = record(kube, node)
        if rec and (not seen or seen[-1] != rec.state):
            seen.append(rec.state)
        if rec and rec.state is State.VALIDATING:
            break
        answer_requests(kube, node)
    assert seen == [State.DRAINING, State.REMEDIATING, State.VALIDATING]
    rec = record(kube, node)
    assert rec.preflight_for == rec.since  # the trigger is remembered on the node
    assert c.calls["delete_preflight_pod"] == 1
    pods = {p.metadata.name: p for p in preflight_pods(kube, ns, node)}
    assert old_pod not in pods or pods[old_pod].metadata.deletion_timestamp is not None
    assert pods[other].metadata.deletion_timestamp is None  # the agent's pod stays

    # A restarted controller waits for this validation's run; it does not delete again.
    c2 = kube_cluster(**settings)
    ctl2 = Controller(c2, config=CFG)
    for _ in range(3):
        ctl2.reconcile()
    assert record(kube, node).state is State.VALIDATING  # the pass at join is too old
    assert c2.calls["delete_preflight_pod"] == 0 and c2.calls["list_preflight_pods"] == 0

    # The DaemonSet's fresh pod runs preflight and writes a pass newer than the validation.
    fresh = daemon_pod(kube, ns, node, LABELS)
    pf = {"result": "pass", "at": utcnow().isoformat(), "summary": "after reset"}
    kube.core().patch_node(
        node, {"metadata": {"annotations": {wire.PREFLIGHT_ANNOTATION: json.dumps(pf)}}}
    )
    agent_publish_clean(kube.core(), node)
    ctl2.reconcile()
    assert record(kube, node).state is State.HEALTHY
    taints = {t.key for t in kube.core().read_node(node).spec.taints or []}
    assert wire.UNHEALTHY_TAINT not in taints
    # A repeat of the trigger for that validation would keep the fresh run.
    assert c2.revalidate(node, since=rec.since) == 0
    pods = {p.metadata.name: p for p in preflight_pods(kube, ns, node)}
    assert pods[fresh].metadata.deletion_timestamp is None
