# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""Per-GPU isolation against a real kube-apiserver 1.20.2: a Node whose device plugin took
one GPU out of allocatable (capacity 8, allocatable 7; no kubelet: the test patches the
status as the plugin would), pods on the bad GPU and on others, the agent's pod->GPU
annotation (`core.holders`). Only the bad GPU's holder is evicted; the node is never
cordoned or tainted; the record appears and is released; every case the per-GPU path
cannot verify takes the whole node's ladder."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from ctl_helpers import agent, kube_cluster, wait_for  # noqa: F401  (fixtures)

from gpuvigil.core import holders as holders_wire
from gpuvigil.core import wire
from gpuvigil.core.findings import Action, Status, utcnow
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.gpu_path import IsolationConfig
from gpuvigil.platform.isolation import ISOLATION_ANNOTATION, decode_isolation
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import STATE_ANNOTATION, State, decode_record

pytestmark = pytest.mark.realparts

BAD, OTHER = "GPU-0000bad3", "GPU-0000ok05"


def xid(code: int, gpu: int = 3, uuid_: str = BAD) -> FindingSummary:
    return FindingSummary(
        code=f"XID_{code}",
        component=f"gpu:{gpu}",
        status=Status.FAILED,
        action=Action.RESET_GPU,
        fatal=True,
        check="xid",
        uuid=uuid_,
    )


def setup(
    kube: Any, *, allocatable: int = 7, mapping: bool = True, app: str = ""
) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    name = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    kube.core().patch_node_status(
        name, {"status": {"allocatable": {"nvidia.com/gpu": str(allocatable)}}}
    )
    ns = kube.namespace()
    labels = {"app": app} if app else {}
    kube.create_running_pod(name, namespace=ns, name="holder", gpus=1, labels=labels)
    kube.create_running_pod(name, namespace=ns, name="other", gpus=1)
    kube.create_running_pod(name, namespace=ns, name="cpu-only")
    if mapping:
        msg = holders_wire.GpuHolders(
            read_at=utcnow(), holders={BAD: [f"{ns}/holder"], OTHER: [f"{ns}/other"]}
        )
        ann = {holders_wire.HOLDERS_ANNOTATION: holders_wire.encode(msg)}
        kube.core().patch_node(name, {"metadata": {"annotations": ann}})
    return name, ns


def controller(c: Any, metrics: Any = None, **isolation: Any) -> Controller:
    cfg = ControllerConfig(
        policy=PolicyConfig(fatal_grace_s=0, suspect_grace_s=0),
        safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
        isolation=IsolationConfig(**isolation),
    )
    return Controller(c, config=cfg, metrics=metrics)


def look(kube: Any, name: str) -> tuple[set[str], bool, Any, Any]:
    n = kube.core().read_node(name)
    ann = n.metadata.annotations or {}
    keys = {t.key for t in n.spec.taints or []}
    return (
        keys,
        bool(n.spec.unschedulable),
        decode_isolation(ann.get(ISOLATION_ANNOTATION)),
        (decode_record(ann.get(STATE_ANNOTATION))),
    )


def pods(kube: Any, ns: str) -> set[str]:
    return {p.metadata.name for p in kube.core().list_namespaced_pod(ns).items}


def test_one_bad_gpu_costs_one_gpu(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    name, ns = setup(kube)
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c)

    ctl.reconcile()  # the record, then the holder's eviction (grace 0: gone at once)
    taints, cordoned, iso, rec = look(kube, name)
    assert iso is not None and (iso.index, iso.gpu_uuid, iso.step) == (3, BAD, "evicting")
    assert pods(kube, ns) == {"other", "cpu-only"}  # only the bad GPU's holder went
    assert not cordoned and wire.UNHEALTHY_TAINT not in taints
    assert rec is None or rec.state is State.HEALTHY

    ctl.reconcile()  # nobody holds it: reset that GPU alone
    taints, cordoned, iso, _ = look(kube, name)
    assert iso is not None and iso.step == "resetting" and iso.issued == iso.request_id
    ann = kube.core().read_node(name).metadata.annotations
    req, _ = wire.decode_request(ann[wire.REQUEST_ANNOTATION])
    assert req is not None and req.action == "RESET_GPU" and req.gpus == (3,)
    assert not cordoned and wire.UNHEALTHY_TAINT not in taints

    agent.step(name, fixes=True)  # the reset cured it: a clean report
    ctl.reconcile()
    taints, cordoned, iso, rec = look(kube, name)
    assert iso is None  # released
    assert not cordoned and wire.UNHEALTHY_TAINT not in taints
    assert rec is not None and rec.state is State.HEALTHY
    (ep,) = rec.episodes  # the machine's memory
    assert (ep.gpu, ep.outcome, ep.codes) == (BAD, "cured:RESET_GPU", ("XID_48",))
    assert pods(kube, ns) == {"other", "cpu-only"}


def test_device_plugin_restart_hands_the_node_back(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    name, _ = setup(kube)
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c)
    ctl.reconcile()
    assert look(kube, name)[2] is not None
    # the plugin restarted: every GPU healthy again while the agent still sees the fault
    kube.core().patch_node_status(name, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    ctl.reconcile()
    taints, _, iso, rec = look(kube, name)
    assert iso is None and wire.UNHEALTHY_TAINT in taints
    assert rec is not None and rec.state in (State.SUSPECT, State.DRAINING)


@pytest.mark.parametrize(
    ("case", "findings", "kw"),
    [
        ("allocatable full", [xid(48)], {"allocatable": 8}),
        ("holders unknown", [xid(48)], {"mapping": False}),
        ("two bad GPUs", [xid(48), xid(48, 5, OTHER)], {}),
        ("NVLink fault", [xid(74)], {}),
    ],
)
def test_what_cannot_be_one_gpu_takes_the_whole_node(
    kube, kube_cluster, agent, case, findings, kw
) -> None:  # type: ignore[no-untyped-def]
    name, _ = setup(kube, **kw)
    agent.publish(name, *findings)
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    controller(c).reconcile()
    taints, _, iso, rec = look(kube, name)
    assert iso is None, case
    assert wire.UNHEALTHY_TAINT in taints, case
    assert rec is not None and rec.state in (State.SUSPECT, State.DRAINING), case


def test_a_fault_the_reset_does_not_cure_keeps_the_gpu_out_and_the_node_in(
    kube, kube_cluster, agent
) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    from gpuvigil.platform.metrics import build

    registry = CollectorRegistry()
    name, ns = setup(kube)
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c, build(registry))
    ctl.reconcile()
    gauge = lambda step: registry.get_sample_value("gpuvigil_gpus_isolated", {"step": step})  # noqa: E731
    assert gauge("evicting") == 1
    ctl.reconcile()  # reset asked
    agent.step(name, fixes=False)  # the reset succeeded, the fault is still there
    agent.publish(name, xid(48))
    ctl.reconcile()
    taints, cordoned, iso, rec = look(kube, name)
    assert iso is not None and iso.step == "isolated"
    assert not cordoned and wire.UNHEALTHY_TAINT not in taints
    assert rec is not None and rec.state is State.HEALTHY
    assert rec.episodes[-1].outcome == "gpu-isolated" and rec.episodes[-1].gpu == BAD
    assert (gauge("isolated"), gauge("evicting"), gauge("resetting")) == (1, 0, 0)
    assert pods(kube, ns) == {"other", "cpu-only"}
    ctl.reconcile()  # and it stays so, pass after pass
    assert look(kube, name)[2].step == "isolated"


def test_a_node_someone_else_blocked_is_left_alone(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    name, ns = setup(kube)
    kube.kubectl("cordon", name)  # a person's maintenance
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    controller(c).reconcile()
    assert look(kube, name)[2] is None
    assert pods(kube, ns) == {"holder", "other", "cpu-only"}


def test_a_pdb_holds_the_holders_eviction_until_the_deadline(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    import time

    kube.start_disruption_controller()
    app = uuid.uuid4().hex[:6]
    name, ns = setup(kube, app=app)
    kube.guard_with_pdb(ns, app)
    agent.publish(name, xid(48))
    c = kube_cluster(node_selector=f"fleet={name.split('-')[1]}")
    ctl = controller(c, evict_timeout_s=4)
    ctl.reconcile()  # the Eviction API says 429: the holder stays, nothing is forced
    assert pods(kube, ns) == {"holder", "other", "cpu-only"}
    assert look(kube, name)[2].step == "evicting"
    time.sleep(4.5)
    agent.publish(name, xid(48))  # a fresh report, as the agent's heartbeat
    ctl.reconcile()  # past the deadline: removed, as a drain removes what is left
    assert pods(kube, ns) == {"other", "cpu-only"}

    def said() -> bool:  # Events go out from the recorder's own thread
        got = kube.core().list_event_for_all_namespaces(field_selector="reason=GpuIsolation")
        return any(e.involved_object.name == name and "PDB" in (e.message or "")
                   for e in got.items)  # fmt: skip

    wait_for(said, 10, "a warning Event for the holder removed past its PDB")
