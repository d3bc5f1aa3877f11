"""The lab kubelet's device manager on the real kube-apiserver 1.20.2: pods asking for
`nvidia.com/gpu` get whole GPUs of the machine's fake NVML (lowest index free first), the
PodResources socket lists them as the agent reads it (`node.pod_resources`), and a
pod's GPUs are free again once it is gone; the device plugin withholds a GPU a critical Xid
marked Unhealthy until it restarts."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import holders as wire
from gpuvigil.lab import faults
from gpuvigil.lab.kubelet import Kubelet
from gpuvigil.lab.machine import Machine
from gpuvigil.node import pod_resources

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


@pytest.fixture
def kubelet(kube: Any, tmp_path: Path) -> Iterator[tuple[Kubelet, str, Callable[[], None]]]:
    """A lab kubelet on a registered Node of its own namespace, and one pass of it."""
    ns = kube.namespace("labdev")
    node = f"lab-dev-{ns[-6:]}"
    m = Machine(node, tmp_path / node, kubeconfig=kube.kubeconfig, agent_config={})
    m.create()
    core = kube.core()
    k = Kubelet(m, core, pods_dir=tmp_path / "pods")
    k.register(labels={}, taints=[])

    def sync() -> None:
        k.sync(json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"])

    try:
        yield k, ns, sync
    finally:
        k.stop()
        m.stop()


def test_pods_get_whole_gpus_and_the_socket_lists_them(
    kubelet: tuple[Kubelet, str, Callable[[], None]],
) -> None:
    k, ns, sync = kubelet
    m, core, node = k.machine, k.api, k.node
    for name, gpus in (("two", 2), ("one", 1), ("none", 0)):
        core.create_namespaced_pod(ns, pod(name, node, gpus))
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

    # A pod that ran to completion (its object stays, Succeeded) frees its GPUs too.
    done = pod("done", node, 5)
    done["spec"]["restartPolicy"] = "Never"
    done["spec"]["containers"][0]["command"] = ["python", "-c", "pass"]
    core.create_namespaced_pod(ns, done)
    deadline = time.monotonic() + 30
    while core.read_namespaced_pod("done", ns).status.phase != "Succeeded":
        assert time.monotonic() < deadline, "the pod never ran to completion"
        sync()
        time.sleep(0.2)
    core.create_namespaced_pod(ns, pod("five", node, 5))
    sync()
    keys = [d.pod_key for d in pod_resources.read(m.pod_resources_socket, timeout_s=5).devices]
    assert keys.count(f"{ns}/five") == 5 and f"{ns}/done" not in keys


def test_the_device_plugin_withholds_a_bad_gpu_until_it_restarts(
    kubelet: tuple[Kubelet, str, Callable[[], None]],
) -> None:
    """A critical Xid on a GPU: the Node's allocatable nvidia.com/gpu drops to 7 of 8 and no
    new pod is given that GPU, while its holder keeps it; the plugin's restart (the
    machine's reboot) offers all 8 again."""
    k, ns, sync = kubelet
    m, core, node = k.machine, k.api, k.node

    def gpus() -> tuple[str, str]:
        st = core.read_node(node).status
        return st.capacity["nvidia.com/gpu"], st.allocatable["nvidia.com/gpu"]

    core.create_namespaced_pod(ns, pod("first", node, 1))  # gets GPU 0
    sync()
    faults.row_remap_failure(m, 0)
    core.create_namespaced_pod(ns, pod("next", node, 1))
    sync()
    assert gpus() == ("8", "7")
    uuids = [g.uuid for g in m.fake_node().gpus]
    got = pod_resources.read(m.pod_resources_socket, timeout_s=5)
    held = {d.pod_key: d.device_id for d in got.devices}
    assert held == {f"{ns}/first": uuids[0], f"{ns}/next": uuids[1]}  # kept; not given
    k.reboot()
    assert gpus() == ("8", "8") and k.plugin.restarts == 1
