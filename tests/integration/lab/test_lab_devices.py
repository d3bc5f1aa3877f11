"""The lab kubelet's device manager on the real kube-apiserver 1.20.2: pods asking for
`nvidia.com/gpu` get whole GPUs of the machine's fake NVML (lowest index free first), the
PodResources socket lists them as the agent reads it (`node.probes.pod_resources`), and a
pod's GPUs are free again once it is gone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import holders as wire
from gpuvigil.lab.kubelet import Kubelet
from gpuvigil.lab.machine import Machine
from gpuvigil.node.probes import pod_resources

pytestmark = pytest.mark.realparts


def pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "containers": [{"name": "main", "image": "pause", "resources": {"limits": limits}}],
        },
    }


def test_pods_get_whole_gpus_and_the_socket_lists_them(kube: Any, tmp_path: Path) -> None:
    ns = kube.namespace("labdev")
    node = f"lab-dev-{ns[-6:]}"
    m = Machine(node, tmp_path / node, kubeconfig=kube.kubeconfig, agent_config={})
    m.create()
    core = kube.core()
    k = Kubelet(m, core, pods_dir=tmp_path / "pods")
    k.register(labels={}, taints=[])
    try:
        for name, gpus in (("two", 2), ("one", 1), ("none", 0)):
            core.create_namespaced_pod(ns, pod(name, node, gpus))

        def sync() -> None:
            listed = core.list_namespaced_pod(ns, _preload_content=False)
            k.sync(json.loads(listed.data)["items"])

        sync()
        uuids = [g.uuid for g in m.fake_node().gpus]
        got = pod_resources.read(m.pod_resources_socket, timeout_s=5)
        assert got.ok, got.message
        msg = wire.build(got.read_at, [(d.pod_key, d.resource, d.device_id) for d in got.devices])
        held = {gpu: pods for gpu, pods in msg.holders.items()}
        assert sorted(held.values()) == [[f"{ns}/one"], [f"{ns}/two"], [f"{ns}/two"]]
        assert set(held) <= set(uuids) and len(held) == 3 and msg.complete
        one = next(g for g, p in held.items() if p == [f"{ns}/one"])
        assert m.agent_config == {} and "pod_resources" in (m.dir / "agent.yaml").read_text()

        # The 1-GPU pod goes: its GPU is free, and the next pod may get it.
        core.delete_namespaced_pod("one", ns, grace_period_seconds=0)
        sync()
        core.create_namespaced_pod(ns, pod("again", node, 1))
        sync()
        got = pod_resources.read(m.pod_resources_socket, timeout_s=5)
        after = {(d.pod_key, d.device_id) for d in got.devices}
        assert (f"{ns}/again", one) in after and not any(p == f"{ns}/one" for p, _ in after)
    finally:
        k.stop()
        m.stop()
