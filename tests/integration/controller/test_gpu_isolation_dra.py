# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""The controller's per-GPU path with DRA, on the real kube-apiserver 1.20.2 with the DRA
kinds served by CRDs of their shape (fixtures/dra_crds.yaml; test_k8s_dra.py says what that
can and cannot show). A node whose device plugin does NOT agree (allocatable 8 of 8), a
ResourceSlice publishing the bad GPU, ResourceClaims reserving it and another GPU for two
pods. The controller writes the DeviceTaintRule with effect None and then NoSchedule,
records scope "dra", evicts only the claim's holder, never taints or cordons the node, and
deletes the rule on release; a rule the API refuses hands the node to its whole ladder."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from ctl_helpers import agent, kube_cluster  # noqa: F401  (fixtures)
from test_gpu_isolation import BAD, OTHER, controller, look, pods, xid

from gpuvigil.core import wire
from gpuvigil.platform.clusters import k8s_dra as dra
from gpuvigil.platform.state import State

pytestmark = pytest.mark.realparts
CRDS = Path(__file__).parent / "fixtures/dra_crds.yaml"
G, RULES = "resource.k8s.io", "devicetaintrules"


def apply(kube: Any, text: str) -> None:
    end = time.monotonic() + 60
    while True:  # a CRD another module deleted may still be terminating
        out = kube.kubectl("apply", "-f", "-", input=text)
        if out.returncode == 0 or time.monotonic() > end:
            assert out.returncode == 0, out.stderr
            return
        time.sleep(0.5)


@pytest.fixture(scope="module")
def dra_kube(kube: Any) -> Any:
    apply(kube, CRDS.read_text())
    taints = dra.DeviceTaints(kube.api_client())
    end = time.monotonic() + 30
    while taints.served() != dra.Served("v1beta2", "v1", "v1"):
        assert time.monotonic() < end, "the DRA CRDs are not served"
        time.sleep(0.2)
    yield kube
    kube.kubectl("delete", "-f", str(CRDS), "--ignore-not-found")


def setup(kube: Any) -> tuple[str, str, dra.Device]:
    """A node (device plugin still counting all 8), its slice, two pods with claims."""
    tag = uuid.uuid4().hex[:6]
    name = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    custom = dra.DeviceTaints(kube.api_client()).custom

    def device(n: str, uuid_: str) -> dict[str, Any]:
        return {"name": n, "attributes": {"uuid": {"string": uuid_}}}

    custom.create_cluster_custom_object(G, "v1", "resourceslices", {
        "apiVersion": f"{G}/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": f"{name}-gpu.nvidia.com-"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                 "devices": [device("gpu-3", BAD), device("gpu-5", OTHER)]},
    })  # fmt: skip
    ns = kube.namespace()
    for pod, dev in (("holder", "gpu-3"), ("other", "gpu-5")):
        kube.create_running_pod(name, namespace=ns, name=pod)
        claim = custom.create_namespaced_custom_object(G, "v1", ns, "resourceclaims", {
            "apiVersion": f"{G}/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"{pod}-gpu"}, "spec": {}})  # fmt: skip
        claim["status"] = {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": name, "device": dev}]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"u-{pod}"}],
        }  # fmt: skip
        custom.replace_namespaced_custom_object_status(G, "v1", ns, "resourceclaims",
                                                       f"{pod}-gpu", claim)  # fmt: skip
    kube.create_running_pod(name, namespace=ns, name="cpu-only")
    return name, ns, dra.Device("gpu.nvidia.com", name, "gpu-3", BAD)


class RuleWatch:
    """Every version of one DeviceTaintRule the API server shows, as (event, effect)."""

    def __init__(self, kube: Any, rule: str) -> None:
        from kubernetes import watch

        self.seen: list[tuple[str, str]] = []
        self.w = watch.Watch()
        custom = dra.DeviceTaints(kube.api_client()).custom
        rv = custom.list_cluster_custom_object(G, "v1beta2", RULES)["metadata"]["resourceVersion"]

        def run() -> None:
            try:
                for ev in self.w.stream(custom.list_cluster_custom_object, G, "v1beta2", RULES,
                                        resource_version=rv, timeout_seconds=60):  # fmt: skip
                    obj = ev["object"]
                    if obj.get("metadata", {}).get("name") == rule:
                        self.seen.append((ev["type"], obj["spec"]["taint"]["effect"]))
            except Exception:  # stop() ends the stream mid-read
                return

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def until(self, n: int) -> list[tuple[str, str]]:
        end = time.monotonic() + 10
        while len(self.seen) < n and time.monotonic() < end:
            time.sleep(0.05)
        self.w.stop()
        return self.seen


def test_dra_rule_none_then_noschedule_holder_evicted_node_untouched(
    dra_kube, kube_cluster, agent
) -> None:  # type: ignore[no-untyped-def]
    kube = dra_kube
    name, ns, dev = setup(kube)
    taints = dra.DeviceTaints(kube.api_client())
    watch = RuleWatch(kube, dra.rule_name(dev))
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c)

    ctl.reconcile()  # record, rule (dry run, then enforced), then the claim holder evicted
    assert watch.until(2) == [("ADDED", "None"), ("MODIFIED", "NoSchedule")]
    node_taints, cordoned, iso, rec = look(kube, name)
    assert iso is not None and (iso.scope, iso.index, iso.gpu_uuid) == ("dra", 3, BAD)
    assert iso.device == dev.resource_id and iso.step == "evicting"
    assert dra.enforces(taints.rule(dev), dev)
    assert pods(kube, ns) == {"other", "cpu-only"}  # only the claim's pod went
    assert not cordoned and not node_taints  # never a node taint: not ours, not NoExecute
    assert rec is None or rec.state is State.HEALTHY

    ctl.reconcile()  # nobody holds it: that GPU's reset
    assert look(kube, name)[2].step == "resetting"
    assert dra.enforces(taints.rule(dev), dev)
    agent.step(name, fixes=True)  # the reset cured it
    ctl.reconcile()
    node_taints, cordoned, iso, rec = look(kube, name)
    assert iso is None and taints.rule(dev) is None  # released: the rule deleted
    assert not cordoned and not node_taints
    assert rec is not None and rec.state is State.HEALTHY
    assert rec.episodes[-1].outcome == "cured:RESET_GPU"


def test_dra_whole_node_fallback_deletes_the_rule(dra_kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    kube = dra_kube
    name, _, dev = setup(kube)
    taints = dra.DeviceTaints(kube.api_client())
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c, evict_timeout_s=600)
    ctl.reconcile()
    assert look(kube, name)[2].scope == "dra" and taints.rule(dev) is not None
    agent.publish(name, xid(48), xid(48, 5, OTHER))  # a second bad GPU: the whole node's
    ctl.reconcile()
    node_taints, _, iso, rec = look(kube, name)
    assert iso is None and taints.rule(dev) is None
    assert wire.UNHEALTHY_TAINT in node_taints
    assert rec is not None and rec.state in (State.SUSPECT, State.DRAINING)


def test_a_rule_found_gone_takes_the_whole_node(dra_kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    kube = dra_kube
    name, _, dev = setup(kube)
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c, evict_timeout_s=600)
    ctl.reconcile()
    assert look(kube, name)[2].scope == "dra"
    # someone deletes it (or a controller died between the record and the rule)
    out = kube.kubectl("delete", f"{RULES}.{G}", dra.rule_name(dev))
    assert out.returncode == 0, out.stderr
    agent.publish(name, xid(48))
    ctl.reconcile()  # new work could reach the GPU: fail closed, the whole node
    node_taints, _, iso, rec = look(kube, name)
    assert iso is None and wire.UNHEALTHY_TAINT in node_taints
    assert rec is not None and rec.state in (State.SUSPECT, State.DRAINING)


def refusing_none(kube: Any) -> None:
    """DeviceTaintRule's schema without the None effect (as an API before 1.35)."""
    docs = list(yaml.safe_load_all(CRDS.read_text()))
    (crd,) = [d for d in docs if d["metadata"]["name"] == f"{RULES}.{G}"]

    def drop(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("effect"), dict) and "enum" in node["effect"]:
                node["effect"]["enum"].remove("None")
            for v in node.values():
                drop(v)
        elif isinstance(node, list):
            for v in node:
                drop(v)

    drop(crd)
    apply(kube, yaml.safe_dump(crd))
    probe = dra.rule_body(dra.Device("gpu.nvidia.com", "p", "probe"), version="v1beta2",
                          reason="probe", effect="None", now=datetime.now(UTC))  # fmt: skip
    end = time.monotonic() + 30
    while kube.kubectl("create", "--dry-run=server", "-f", "-",
                       input=yaml.safe_dump(probe)).returncode == 0:  # fmt: skip
        assert time.monotonic() < end, "the schema change was not served"
        time.sleep(0.2)


@pytest.mark.parametrize("case", ["effect None refused", "a rule of that name not ours"])
def test_a_refused_rule_takes_the_whole_node(dra_kube, kube_cluster, agent, case) -> None:  # type: ignore[no-untyped-def]
    kube = dra_kube
    name, _, dev = setup(kube)
    taints = dra.DeviceTaints(kube.api_client())
    if case == "effect None refused":
        refusing_none(kube)
    else:
        body = dra.rule_body(dev, version="v1beta2", reason="admin", effect="NoSchedule",
                             now=datetime.now(UTC))  # fmt: skip
        body["metadata"]["labels"] = {}
        taints.custom.create_cluster_custom_object(G, "v1beta2", RULES, body)
    try:
        agent.publish(name, xid(48))
        c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
        controller(c).reconcile()
        node_taints, _, iso, rec = look(kube, name)
        assert iso is None, case
        assert wire.UNHEALTHY_TAINT in node_taints, case  # fail closed: the whole node
        assert rec is not None and rec.state in (State.SUSPECT, State.DRAINING), case
        left = taints.rule(dev)
        if case == "effect None refused":
            assert left is None
        else:  # someone else's rule is never deleted
            assert left is not None and left["spec"]["taint"]["value"] == "admin"
    finally:
        apply(kube, CRDS.read_text())
