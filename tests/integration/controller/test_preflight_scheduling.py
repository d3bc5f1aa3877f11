# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""With the real kube-scheduler: the controller's preflight pod for a new node is scheduled
onto that node with every GPU the node has, and once it has run a workload can still get
every GPU of the node (the old DaemonSet kept them reserved for the pod's life).
Real kube-apiserver + kube-scheduler 1.20.2; the test plays the node's kubelet."""

from __future__ import annotations

import uuid

import pytest
from ctl_helpers import agent, health, kube_cluster, preflight_passes, wait_for  # noqa: F401

from gpuvigil.core import wire
from gpuvigil.platform.controller import Controller
from gpuvigil.platform.state import State, decode_record

pytestmark = pytest.mark.realparts


def test_after_preflight_a_workload_gets_every_gpu(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    kube.start_scheduler()
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(
        f"gpu-{tag}",
        labels={"fleet": tag},
        gpus=4,
        taints=[{"key": wire.UNVALIDATED_TAINT, "effect": "NoSchedule"}],
    )
    v1 = kube.core()
    v1.patch_node(node, {"metadata": {"annotations": {wire.HEALTH_ANNOTATION: health()}}})
    ctl = Controller(kube_cluster(node_selector=f"fleet={tag}", pool_gpus={"default": 4}))
    ctl.reconcile()  # a new node: VALIDATING, and its preflight pod is created

    def run() -> object:
        from gpuvigil.platform.clusters.k8s_preflight import label_value

        pods = v1.list_namespaced_pod(
            "gpuvigil", label_selector=f"gpuvigil.io/node={label_value(node)}"
        ).items
        return pods and pods[0].spec.node_name == node and pods[0]

    wait_for(run, 30, "the scheduler to place the preflight pod on its node")
    pod = run()
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"

    # The kubelet reports the run finished with exit 0: it holds nothing any more.
    assert preflight_passes(kube, node) == [pod.metadata.name]
    ctl.reconcile()
    rec = decode_record((v1.read_node(node).metadata.annotations or {}).get("gpuvigil.io/state"))
    assert rec is not None and rec.state is State.HEALTHY
    assert wire.UNVALIDATED_TAINT not in {t.key for t in v1.read_node(node).spec.taints or []}
    ns = kube.namespace()
    v1.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "all-gpus"}, "spec": {"nodeSelector": {"fleet": tag},
        "containers": [{"name": "c", "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})  # fmt: skip
    wait_for(
        lambda: v1.read_namespaced_pod("all-gpus", ns).spec.node_name == node,
        30,
        "the scheduler to give the workload all 4 GPUs of the node",
    )
