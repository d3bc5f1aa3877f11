# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""The controller against a real kube-apiserver 1.20.2 (+ etcd, kube-scheduler, and
kube-controller-manager's disruption controller): no kubelets, the test plays the agent."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from ctl_helpers import CANNOT_RUN, FATAL, agent, kube_cluster, wait_for  # noqa: F401  (fixtures)

from gpuvigil.core import wire
from gpuvigil.platform.clusters.base import Conflict
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import Record, State, decode_record

pytestmark = pytest.mark.realparts


def fleet(kube: Any, n: int, **kw: Any) -> tuple[str, list[str]]:
    tag = uuid.uuid4().hex[:6]
    names = [kube.create_node(f"gpu-{tag}-{i}", labels={"fleet": tag}, **kw) for i in range(n)]
    return f"fleet={tag}", names


def config(**policy: Any) -> ControllerConfig:
    return ControllerConfig(
        policy=PolicyConfig(**{"fatal_grace_s": 0, **policy}),  # fatal: drain at once
        safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
    )


def state_of(kube: Any, node: str) -> Record | None:
    ann = kube.core().read_node(node).metadata.annotations or {}
    return decode_record(ann.get("gpuvigil.io/state"))


def taints(kube: Any, node: str) -> set[str]:
    return {t.key for t in kube.core().read_node(node).spec.taints or []}


def test_view_blocks_and_conflicts(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    sel, (name,) = fleet(kube, 1)
    c = kube_cluster(node_selector=sel)
    agent.publish(name)
    (v,) = c.list_nodes()
    assert v.health is not None and v.health_error is None and v.record is None
    kube.kubectl("cordon", name)
    kube.core().patch_node(
        name, {"spec": {"taints": [{"key": "other.io/maintenance", "effect": "NoSchedule"}]}}
    )
    c.block(name, reason="t")
    v = c.get_node(name)
    assert v.blocked_by_us and set(v.blocked_by_others) == {"cordon", "taint:other.io/maintenance"}
    c.unblock(name)
    n = kube.core().read_node(name)
    assert n.spec.unschedulable is True  # a human's cordon is never lifted
    assert {t.key for t in n.spec.taints} >= {"other.io/maintenance"}
    assert wire.UNHEALTHY_TAINT not in {t.key for t in n.spec.taints}
    v = c.get_node(name)
    c.store(name, Record(state=State.SUSPECT), version=v.version)
    with pytest.raises(Conflict):
        c.store(name, Record(state=State.HEALTHY), version=v.version)


def test_taint_keeps_new_pods_off(kube, kube_cluster) -> None:  # type: ignore[no-untyped-def]
    kube.start_scheduler()
    sel, (name,) = fleet(kube, 1)
    c = kube_cluster(node_selector=sel)
    c.block(name, reason="t")
    ns = kube.namespace()
    why = kube.unschedulable_pod(ns, node_selector={"fleet": sel.split("=")[1]})
    assert "taint" in why, why  # kept off by the taint (the scheduler says so)
    c.unblock(name)
    v1 = kube.core()
    wait_for(lambda: v1.read_namespaced_pod("p", ns).spec.node_name == name, 30, "scheduled")


def test_eviction_honours_pdb_until_the_deadline(kube, kube_cluster) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from gpuvigil.core.findings import utcnow

    kube.start_disruption_controller()
    sel, (name,) = fleet(kube, 1)
    ns = kube.namespace()
    app = uuid.uuid4().hex[:6]
    kube.create_running_pod(name, namespace=ns, name="guarded", labels={"app": app})
    kube.create_running_pod(name, namespace=ns, name="free")
    kube.guard_with_pdb(ns, app)
    c = kube_cluster(node_selector=sel)
    st = c.drain(name, deadline=utcnow() + timedelta(seconds=60), reason="XID_79")
    assert (st.remaining, st.blocked) == (1, 1)  # "free" evicted (v1beta1 here), "guarded" 429
    assert c.drainer._eviction_version == "policy/v1beta1"
    st = c.drain(name, deadline=utcnow() - timedelta(seconds=1), reason="XID_79")
    assert st.done and st.forced == 1


def test_evicted_pods_carry_disruption_target(kube, kube_cluster) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from gpuvigil.core.findings import utcnow

    sel, (name,) = fleet(kube, 1)
    ns = kube.namespace()
    kube.create_running_pod(name, namespace=ns, name="job-pod")
    c = kube_cluster(node_selector=sel, eviction_grace_s=30)  # stays Terminating: no kubelet
    st = c.drain(name, deadline=utcnow() + timedelta(seconds=60), reason="XID_79 gpu:3")
    assert st.remaining == 1  # terminating pods still count until they are gone
    pod = kube.core().read_namespaced_pod("job-pod", ns)
    assert pod.metadata.deletion_timestamp is not None
    cond = {c.type: c for c in pod.status.conditions}["DisruptionTarget"]
    assert cond.status == "True" and "XID_79" in cond.message


def test_pool_grace_follows_the_configured_pool_label(kube, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A site that names its own pool label gets its pools' eviction grace: the config file
    goes through `gpuvigil controller`'s own loading and adapter opening, and the evicted
    pod's deletionGracePeriodSeconds on the API server shows which pool the node was in."""
    from datetime import timedelta

    from gpuvigil.commands.controller import load_controller_config, open_or_exit
    from gpuvigil.core.findings import utcnow

    sel, (name,) = fleet(kube, 1)
    # the site's label names the pool; the default label on the same node names another
    kube.core().patch_node(
        name, {"metadata": {"labels": {"example.com/gpu-pool": "big", "gpuvigil.io/pool": "x"}}}
    )
    ns = kube.namespace()
    kube.create_running_pod(name, namespace=ns, name="job-pod")
    path = tmp_path / "controller.yaml"
    path.write_text(
        "controller:\n"
        "  cluster: kubernetes\n"
        "  safety: {pool_label: example.com/gpu-pool}\n"
        "  kubernetes:\n"
        f"    kubeconfig: {kube.kubeconfig}\n"
        f"    node_selector: '{sel}'\n"
        f"    lease_namespace: {kube.namespace('lease')}\n"
        "    eviction_grace_s: 30\n"
        "    pool_eviction_grace_s: {big: 45, x: 40}\n"
    )
    c = open_or_exit(load_controller_config(path, {}).controller)
    try:
        assert [v.pool for v in c.list_nodes()] == ["big"]
        st = c.drain(name, deadline=utcnow() + timedelta(seconds=60), reason="XID_79")
        assert st.remaining == 1  # stays Terminating (no kubelet), with the grace it was given
        pod = kube.core().read_namespaced_pod("job-pod", ns)
        assert pod.metadata.deletion_grace_period_seconds == 45
    finally:
        c.close()


def test_full_ladder_and_a_humans_cordon(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    sel, names = fleet(kube, 3)
    bad = names[0]
    ns = kube.namespace()
    kube.create_running_pod(bad, namespace=ns)
    kube.kubectl("cordon", names[1])
    for n in names:
        agent.publish(n)
    agent.publish(bad, FATAL)
    agent.publish(names[1], FATAL)  # cordoned by a human: gpuvigil leaves it alone
    c = kube_cluster(node_selector=sel)
    ctl = Controller(c, config=config())
    seen = []
    for _ in range(20):
        ctl.reconcile()
        rec = state_of(kube, bad)
        if rec and (not seen or seen[-1] != rec.state):
            seen.append(rec.state)
        if rec and rec.state is State.HEALTHY:
            break
        agent.step(bad, fixes=len(agent.answered) > 0)
    assert seen == [
        State.DRAINING,
        State.REMEDIATING,
        State.VALIDATING,
        State.REMEDIATING,
        State.VALIDATING,
        State.HEALTHY,
    ]
    assert [a for _, a in agent.answered] == ["RESET_GPU", "REBOOT"]  # escalated once, no repeat
    assert taints(kube, bad).isdisjoint({wire.UNHEALTHY_TAINT, wire.UNVALIDATED_TAINT})
    assert kube.core().read_node(names[1]).spec.unschedulable is True
    assert state_of(kube, names[1]) is None  # never touched
    assert c.events.flush(30)  # Events are sent by a background thread
    events = kube.core().list_namespaced_event(
        "default", field_selector=f"involvedObject.name={bad}"
    )
    assert any(e.reason == "gpuvigilDraining" for e in events.items)


def test_fault_storm_trips_the_breaker_and_recoveries_continue(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    from prometheus_client import CollectorRegistry

    from gpuvigil.platform import metrics as pmetrics

    sel, names = fleet(kube, 10)
    for n in names:
        agent.publish(n)
    for n in names[:5]:  # half the fleet at once: a bad driver roll-out, not five bad GPUs
        agent.publish(n, FATAL)
    registry = CollectorRegistry()
    ctl = Controller(
        kube_cluster(node_selector=sel), config=config(), metrics=pmetrics.build(registry)
    )
    ctl.reconcile()
    assert registry.get_sample_value("gpuvigil_circuit_breaker_open") == 1
    assert registry.get_sample_value("gpuvigil_circuit_breaker_trips_total") == 1
    sig = {"code": "XID_79", "attribute": "", "value": ""}
    assert registry.get_sample_value("gpuvigil_circuit_breaker_signature_nodes", sig) == 5
    for n in names[:5]:  # held: never drained, but a fatal finding still blocks (#22 item 1)
        rec = state_of(kube, n)
        assert rec is not None and rec.state is State.SUSPECT and rec.hold
        assert wire.UNHEALTHY_TAINT in taints(kube, n)
    assert registry.get_sample_value("gpuvigil_disruptions_held") == 5
    agent.publish(names[0])  # one recovers while the breaker is open
    ctl.reconcile()
    assert not state_of(kube, names[0]).hold
    # 4 of 10 still show it: the breaker stays open (not just one window after the burst)
    assert registry.get_sample_value("gpuvigil_circuit_breaker_open") == 1
    assert registry.get_sample_value("gpuvigil_circuit_breaker_signature_nodes", sig) == 4
    # a restarted controller holds what the one that died held (the marks on the nodes)
    again = Controller(kube_cluster(node_selector=sel), config=config())
    again.reconcile()
    assert again.breaker.status.causes == ["xid/XID_79@fleet"]
    assert all(wire.UNHEALTHY_TAINT in taints(kube, n) for n in names[1:5])
    assert all(state_of(kube, n).state is State.SUSPECT for n in names[1:5])


def test_tool_breakage_is_held_not_blocked_and_real_faults_are_repaired(  # type: ignore[no-untyped-def]
    kube, kube_cluster, agent, tmp_path
) -> None:
    """An upgrade drops nvidia-smi: one check fails closed on 6 of 12 nodes. The first
    two are blocked (not yet a pattern: fail closed); when the rest follow, the breaker
    opens on that signature, gpuvigil lifts its own taints and blocks none of them, while a
    node with a real fault meanwhile is tainted and drained within budget."""
    import json

    from gpuvigil.core.events import EventWriter

    sel, names = fleet(kube, 12)
    for n in names:
        agent.publish(n)
    ctl = Controller(
        kube_cluster(node_selector=sel),
        config=config(),
        events=EventWriter(tmp_path / "events.jsonl"),
    )
    for n in names[:2]:
        agent.publish(n, CANNOT_RUN)
    ctl.reconcile()
    assert not ctl.breaker.status.open
    assert all(wire.UNHEALTHY_TAINT in taints(kube, n) for n in names[:2])
    for n in names[2:6]:
        agent.publish(n, CANNOT_RUN)
    agent.publish(names[6], FATAL)
    ctl.reconcile()
    assert ctl.breaker.status.causes == ["nvml/DEPENDENCY_MISSING@fleet"]
    for n in names[:6]:
        assert wire.UNHEALTHY_TAINT not in taints(kube, n), n
        assert (state_of(kube, n) or Record()).state is State.HEALTHY
    assert wire.UNHEALTHY_TAINT in taints(kube, names[6])
    assert state_of(kube, names[6]).state is State.DRAINING
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    breaker = [json.loads(x)["data"] for x in lines if '"breaker"' in x]
    assert breaker[0]["state"] == "open"
    assert breaker[0]["causes"] == ["nvml/DEPENDENCY_MISSING@fleet"]
    assert breaker[0]["change"] == "fleet-wide" and breaker[0]["nodes"] == 6


def test_agent_started_is_not_an_answer_and_new_nodes_validate(kube, kube_cluster, agent) -> None:  # type: ignore[no-untyped-def]
    import json

    from gpuvigil.core.findings import utcnow

    sel, (name,) = fleet(kube, 1, taints=[{"key": wire.UNVALIDATED_TAINT, "effect": "NoSchedule"}])
    agent.publish(name)
    c = kube_cluster(node_selector=sel)
    ctl = Controller(c, config=config())
    ctl.reconcile()
    assert state_of(kube, name).state is State.VALIDATING
    agent.step(name)  # writes a preflight pass
    ctl.reconcile()
    assert state_of(kube, name).state is State.HEALTHY
    assert taints(kube, name).isdisjoint({wire.UNHEALTHY_TAINT, wire.UNVALIDATED_TAINT})
    started = {"id": "x", "result": "started", "at": utcnow().isoformat()}
    kube.core().patch_node(
        name, {"metadata": {"annotations": {wire.RESULT_ANNOTATION: json.dumps(started)}}}
    )
    assert c.get_node(name).agent_result is None
