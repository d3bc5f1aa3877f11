# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""After a GPU reset the node validates again: the controller starts one preflight pod for
the validation (from the shipped PodTemplate, asking for every GPU the node has), once,
also across a controller restart; the pod's exit, as the node's kubelet reports it, decides.
Real kube-apiserver 1.20.2, no kubelets: the test plays the agent and the kubelet."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from ctl_helpers import FATAL, agent, kube_cluster, preflight_passes  # noqa: F401  (fixtures)

from gpuvigil.core import wire
from gpuvigil.core.findings import utcnow
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State, decode_record

pytestmark = pytest.mark.realparts
CFG = ControllerConfig(
    policy=PolicyConfig(fatal_grace_s=0),  # drain at once: these tests are about preflight
    safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
)


def record(kube: Any, node: str) -> Any:
    ann = kube.core().read_node(node).metadata.annotations or {}
    return decode_record(ann.get("gpuvigil.io/state"))


def answer_requests(kube: Any, node: str) -> None:
    """The agent: does the requested reset, says so, publishes a clean summary."""
    from ctl_helpers import health, signed_result

    v1 = kube.core()
    ann = v1.read_node(node).metadata.annotations or {}
    req = json.loads(ann.get(wire.REQUEST_ANNOTATION) or "null")
    res = json.loads(ann.get(wire.RESULT_ANNOTATION) or "null")
    if req and (not res or res.get("id") != req["id"]):
        done = {"id": req["id"], "result": "succeeded", "at": utcnow().isoformat()}
        ours = {**signed_result(node, done), wire.HEALTH_ANNOTATION: health()}
        v1.patch_node(node, {"metadata": {"annotations": ours}})


def runs(kube: Any, node: str) -> list[Any]:
    from gpuvigil.platform.clusters.k8s_preflight import label_value

    sel = f"app.kubernetes.io/name=gpuvigil-preflight,gpuvigil.io/node={label_value(node)}"
    return kube.core().list_namespaced_pod("gpuvigil", label_selector=sel).items


def to_validating(
    kube: Any,
    kube_cluster: Any,
    agent: Any,
    *,
    gpus: int,
    pool_gpus: dict[str, int] | None = None,
    before: Callable[[str], None] | None = None,
) -> tuple[str, Any]:
    """A node taken to VALIDATING by a fatal finding and a reset; `pool_gpus` is the
    controller's count (default: `gpus`), `before` runs on the node before any pass."""
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag}, gpus=gpus)
    agent.publish(node, FATAL)
    if before is not None:
        before(node)
    pools = {"default": gpus} if pool_gpus is None else pool_gpus
    c = kube_cluster(node_selector=f"fleet={tag}", pool_gpus=pools)
    ctl = Controller(c, config=CFG)
    seen = []
    for _ in range(10):
        errors = ctl.reconcile().errors
        assert not errors, errors
        rec = record(kube, node)
        if rec and (not seen or seen[-1] != rec.state):
            seen.append(rec.state)
        if rec and rec.state is State.VALIDATING:
            break
        answer_requests(kube, node)
    assert seen == [State.DRAINING, State.REMEDIATING, State.VALIDATING]
    return node, c


def test_reset_then_one_preflight_pod_and_its_pass_returns_the_node(  # type: ignore[no-untyped-def]
    kube, kube_cluster, agent
) -> None:
    node, c = to_validating(kube, kube_cluster, agent, gpus=4)
    rec = record(kube, node)
    assert rec.preflight_for == rec.since  # the run is remembered on the node
    (pod,) = runs(kube, node)
    main = pod.spec.containers[0]
    assert main.resources.limits["nvidia.com/gpu"] == "4"  # every GPU the node has
    assert main.args[-2:] == ["--expect-gpus", "4"] and pod.spec.restart_policy == "Never"
    assert pod.spec.service_account_name == "gpuvigil-preflight"

    # A restarted controller waits for this validation's run; it starts no other.
    c2 = kube_cluster(node_selector=c.settings.node_selector, pool_gpus={"default": 4})
    ctl2 = Controller(c2, config=CFG)
    for _ in range(2):
        ctl2.reconcile()
    assert record(kube, node).state is State.VALIDATING
    assert c2.calls["create_preflight_pod"] == 0 and len(runs(kube, node)) == 1
    assert c2.revalidate(node, since=rec.since) == 0  # a repeat is harmless

    # The node's kubelet reports the pod's exit: 0, a pass newer than the validation.
    assert preflight_passes(kube, node) == [pod.metadata.name]
    ctl2.reconcile()
    assert record(kube, node).state is State.HEALTHY
    taints = {t.key for t in kube.core().read_node(node).spec.taints or []}
    assert wire.UNHEALTHY_TAINT not in taints


def test_a_failed_run_is_a_failed_step_and_the_next_validation_replaces_the_pod(  # type: ignore[no-untyped-def]
    kube, kube_cluster, agent
) -> None:
    node, c = to_validating(kube, kube_cluster, agent, gpus=8)
    (first,) = runs(kube, node)
    preflight_passes(kube, node, exit_code=1, summary="gpu:3 GPU_SDC")
    ctl = Controller(c, config=CFG)
    ctl.reconcile()
    rec = record(kube, node)
    assert rec.state is State.REMEDIATING and "gpu:3 GPU_SDC" in rec.reason
    assert rec.step.value == "REBOOT"
    v1 = kube.core()
    v1.patch_node_status(node, {"status": {"nodeInfo": {"bootID": "after-reboot"}}})
    answer_requests(kube, node)
    ctl.reconcile()
    assert record(kube, node).state is State.VALIDATING
    names = [p.metadata.name for p in runs(kube, node)]
    assert first.metadata.name not in names or any(
        p.metadata.deletion_timestamp
        for p in runs(kube, node)
        if p.metadata.name == first.metadata.name
    )
    assert len([n for n in names if n != first.metadata.name]) == 1


def test_the_gpu_count_is_the_controllers_whatever_the_node_writes(  # type: ignore[no-untyped-def]
    kube, kube_cluster, agent
) -> None:
    """The node's own identity (the default deploy's agent, `system:node:<name>`, the only
    one that may write this Node besides the controller; tests/integration/agent/
    test_node_identity_kubernetes.py tries every other node's) rewrites its allocatable to
    0 and its instance-type label: the run still expects and asks for the pool's 8 GPUs."""
    from kubernetes import client

    zero = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "0"}

    def forge(node: str) -> None:
        api = kube.api_client()
        api.set_default_header("Impersonate-User", f"system:node:{node}")
        api.set_default_header("Impersonate-Group", "system:nodes")
        body = {
            "metadata": {"labels": {"node.kubernetes.io/instance-type": "cpu.tiny"}},
            "status": {"allocatable": zero, "capacity": zero},
        }
        client.CoreV1Api(api).patch_node_status(node, body)
        raw = kube.core().read_node(node)
        assert raw.status.allocatable["nvidia.com/gpu"] == "0"  # the forgery took

    node, _ = to_validating(kube, kube_cluster, agent, gpus=8, before=forge)
    (pod,) = runs(kube, node)
    main = pod.spec.containers[0]
    assert main.args[-2:] == ["--expect-gpus", "8"]
    assert main.resources.limits["nvidia.com/gpu"] == "8"


def test_no_gpu_count_is_a_failed_validation_never_expect_gpus_0(  # type: ignore[no-untyped-def]
    kube, kube_cluster, agent
) -> None:
    node, c = to_validating(kube, kube_cluster, agent, gpus=8, pool_gpus={"other": 8})
    assert runs(kube, node) == []  # no pod: nothing to expect
    Controller(c, config=CFG).reconcile()
    rec = record(kube, node)
    assert rec.state is State.REMEDIATING, rec
    assert "not validated: no GPU count for pool default" in rec.reason
    assert "no node.kubernetes.io/instance-type label" in rec.reason
