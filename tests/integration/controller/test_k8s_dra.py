"""Per-GPU isolation's path choice and the DeviceTaintRule on the real kube-apiserver 1.20.2
(clusters.k8s_dra). 1.20 has no DRA: `resource.k8s.io` is served here by CRDs in the
shape of ResourceSlice (v1), DeviceTaintRule (v1beta2) and ResourceClaim (v1), with the
served types' constraints on the fields gpuvigil writes (fixtures/dra_crds.yaml; the
`api-approved.kubernetes.io` annotation lets a CRD claim the reserved group). What this
shows: discovery picks the path, the GPU is found by its `uuid` attribute, the rule's
body is accepted by a schema of the real shape and moves None -> NoSchedule, claims name
the holders, release deletes the rule. What it cannot: a scheduler that honours device
taints (1.33+), the NVIDIA DRA driver's slices, 1.35's `None` effect validation
(docs/per-gpu.md)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.platform.clusters import k8s_dra as dra
from gpuvigil.platform.clusters.base import Forbidden

pytestmark = pytest.mark.realparts
CRDS = Path(__file__).parent / "fixtures/dra_crds.yaml"
UUID = "GPU-0b1f6a3c-9e1d-4c55-8d0e-1c2b3a4d5e6f"


def plugin_agrees(kube: Any, node: str) -> bool:
    status = kube.core().read_node(node).status
    return int(status.allocatable["nvidia.com/gpu"]) < int(status.capacity["nvidia.com/gpu"])


def served_when(taints: dra.DeviceTaints, pred: Any, timeout: float = 30) -> dra.Served:
    end = time.monotonic() + timeout
    while True:
        got = taints.served()
        if pred(got) or time.monotonic() > end:
            return got
        time.sleep(0.2)


@pytest.fixture(scope="module")
def no_dra(kube: Any) -> Any:
    kube.kubectl("delete", "-f", str(CRDS), "--ignore-not-found")
    return kube


def test_without_dra_the_device_plugin_or_the_whole_node(no_dra):
    kube = no_dra
    taints = dra.DeviceTaints(kube.api_client())
    node = kube.create_node()
    assert served_when(taints, lambda s: s.taint_rules is None) == dra.Served()
    choice = taints.choose(node=node, gpu_uuid=UUID, plugin_agrees=plugin_agrees(kube, node))
    assert choice.path == "node" and "no DeviceTaintRule served" in choice.why
    # The device plugin takes the bad GPU out of allocatable (8 -> 7): it agrees.
    kube.core().patch_node_status(node, {"status": {"allocatable": {"nvidia.com/gpu": "7"}}})
    choice = taints.choose(node=node, gpu_uuid=UUID, plugin_agrees=plugin_agrees(kube, node))
    assert choice.path == "device-plugin"


@pytest.fixture
def with_dra(kube: Any) -> Any:
    applied = kube.kubectl("apply", "-f", str(CRDS))
    assert applied.returncode == 0, applied.stderr
    yield kube
    kube.kubectl("delete", "-f", str(CRDS), "--ignore-not-found", "--wait=false")


def test_with_dra_a_rule_for_the_one_device(with_dra):
    kube = with_dra
    taints = dra.DeviceTaints(kube.api_client())
    served = served_when(taints, lambda s: s.taint_rules and s.slices and s.claims)
    assert served == dra.Served("v1beta2", "v1", "v1")
    node = kube.create_node()
    custom = taints.custom

    # No slice publishes the GPU yet: not a DRA device, and the plugin has not agreed.
    choice = taints.choose(node=node, gpu_uuid=UUID, plugin_agrees=plugin_agrees(kube, node))
    assert choice.path == "node" and "no ResourceSlice" in choice.why

    def device(name: str, uuid: str) -> dict[str, Any]:
        return {"name": name, "attributes": {"uuid": {"string": uuid}, "index": {"int": 3}}}

    for n, devices in ((node, [device("gpu-0", "GPU-other"), device("gpu-3", UUID)]),
                       ("elsewhere", [device("gpu-3", "GPU-far")])):  # fmt: skip
        custom.create_cluster_custom_object(
            "resource.k8s.io",
            "v1",
            "resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"generateName": f"{n}-gpu.nvidia.com-"},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": n,
                         "pool": {"name": n, "generation": 1, "resourceSliceCount": 1},
                         "devices": devices},
            },
        )  # fmt: skip
    choice = taints.choose(node=node, gpu_uuid=UUID, plugin_agrees=False)
    assert choice.path == "dra" and choice.version == "v1beta2"
    assert choice.device == dra.Device("gpu.nvidia.com", node, "gpu-3", UUID)
    dev = choice.device

    # Dry run, then enforce: one object, its effect moved; the server's schema took both.
    assert taints.taint(dev, reason="XID_79", effect="None", version=choice.version)
    first = taints.rule(dev)
    assert first is not None and first["spec"]["taint"]["effect"] == "None"
    assert first["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com",
        "pool": node,
        "device": "gpu-3",
    }
    assert taints.taint(dev, reason="XID_79", effect="NoSchedule")
    rules = custom.list_cluster_custom_object("resource.k8s.io", "v1beta2", "devicetaintrules")[
        "items"
    ]
    ours = [r for r in rules if r["metadata"]["name"] == dra.rule_name(dev)]
    assert len(ours) == 1 and ours[0]["spec"]["taint"]["effect"] == "NoSchedule"
    assert ours[0]["spec"]["taint"]["key"] == "gpuvigil.io/gpu-isolated"

    # A rule of the same name that is not ours is never taken over.
    other = dra.Device("gpu.nvidia.com", node, "gpu-0", "GPU-other")
    body = dra.rule_body(
        other, version="v1beta2", reason="admin", effect="NoSchedule", now=datetime.now(UTC)
    )
    body["metadata"]["labels"] = {}
    custom.create_cluster_custom_object("resource.k8s.io", "v1beta2", "devicetaintrules", body)
    with pytest.raises(Forbidden, match="not gpuvigil's"):
        taints.taint(other, reason="XID_79", effect="None")

    # The holders a ResourceClaim reserves the device for.
    kube.ensure_namespace("ml")
    claim = custom.create_namespaced_custom_object(
        "resource.k8s.io", "v1", "ml", "resourceclaims",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": "train-0-gpu"}, "spec": {}},
    )  # fmt: skip
    claim["status"] = {
        "allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-3"}]}},
        "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "u-1"}],
    }  # fmt: skip
    custom.replace_namespaced_custom_object_status(
        "resource.k8s.io", "v1", "ml", "resourceclaims", "train-0-gpu", claim
    )
    assert taints.claim_holders(dev) == ["ml/train-0"]
    assert taints.claim_holders(other) == []

    # Release: the rule is gone; a second release is done too.
    taints.release(dev)
    assert taints.rule(dev) is None
    taints.release(dev)
