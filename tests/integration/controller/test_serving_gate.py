"""The capacity gate on a real kube-apiserver 1.20: a Deployment run by the real deployment
and replicaset controllers and placed by the real scheduler, a PDB with minAvailable 100%
(the real disruption controller answers 429), and an autoscaling/v2beta2 HPA whose status
the test writes (no metrics server, no HPA controller). Pods are made Ready by status
patches, as a kubelet would.

The gate is asked through the controller's hook (`platform.serving_hook.ServingGuard`), as
`platform.apply` asks it before a drain.
"""

# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FATAL, agent, kube_cluster, wait_for  # noqa: F401  (fixtures)
from prometheus_client import CollectorRegistry

from gpuvigil.core.events import EventWriter
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary, HealthSummary
from gpuvigil.platform.announce import Announcer
from gpuvigil.platform.clusters.k8s_serving import CONDITION, MARK_ANNOTATION
from gpuvigil.platform.metrics import build
from gpuvigil.platform.policy import Op, OpKind
from gpuvigil.platform.serving_hook import ServingGuard
from gpuvigil.platform.serving_pool import ServingConfig
from gpuvigil.platform.state import State

pytestmark = pytest.mark.realparts
HPA = ("autoscaling", "v2beta2")


class Pool:
    """One serving pool's objects in its own namespace, on its own nodes."""

    def __init__(self, kube: Any, *, replicas: int, max_replicas: int, nodes: int = 3) -> None:
        from kubernetes import client

        self.kube, self.ns = kube, kube.namespace("serve")
        self.fleet = uuid.uuid4().hex[:6]
        self.nodes = [kube.create_node(labels={"fleet": self.fleet}) for _ in range(nodes)]
        self.custom = client.CustomObjectsApi(kube.api_client())
        self.apps = client.AppsV1Api(kube.api_client())
        self.core = kube.core()
        labels = {"app": "llm"}
        self.apps.create_namespaced_deployment(self.ns, {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "llm"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "nodeSelector": {"fleet": self.fleet},
                         "containers": [{"name": "c", "image": "vllm",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
        })  # fmt: skip
        kube.kubectl("apply", "-f", "-", input=f"""
apiVersion: policy/v1beta1
kind: PodDisruptionBudget
metadata: {{name: llm, namespace: {self.ns}}}
spec: {{minAvailable: "100%", selector: {{matchLabels: {{app: llm}}}}}}
""")  # fmt: skip
        self.custom.create_namespaced_custom_object(*HPA, self.ns, "horizontalpodautoscalers", {
            "apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "llm"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "llm"},
                     "minReplicas": 1, "maxReplicas": max_replicas},
        })  # fmt: skip
        self.ready_all(replicas)

    def config(self, **kw: Any) -> ServingConfig:
        pool = {"name": "llm", "namespace": self.ns,
                "workload": {"kind": "Deployment", "name": "llm"},
                "demand": [{"kind": "hpa", "name": "llm"}], **kw}  # fmt: skip
        return ServingConfig.model_validate({"pools": [pool]})

    def demand(self, desired: int | None, *, active: str = "True") -> None:
        """Write the HPA's status, as its controller would. None: as before it first ran
        (desiredReplicas 0, no conditions); `active` "False": metrics unavailable."""
        status: dict[str, Any] = {"currentReplicas": self.desired(), "desiredReplicas": 0}
        if desired is not None:
            status["desiredReplicas"] = desired
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status["conditions"] = [
                {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
                 "lastTransitionTime": stamp},
                {"type": "ScalingActive", "status": active, "lastTransitionTime": stamp,
                 "reason": "ValidMetricFound" if active == "True" else "FailedGetResourceMetric"},
            ]  # fmt: skip
        self.custom.patch_namespaced_custom_object_status(
            *HPA, self.ns, "horizontalpodautoscalers", "llm", {"status": status}
        )

    def pods(self) -> list[Any]:
        return [p for p in self.core.list_namespaced_pod(self.ns).items
                if p.metadata.deletion_timestamp is None]  # fmt: skip

    def desired(self) -> int:
        return int(self.apps.read_namespaced_deployment("llm", self.ns).spec.replicas)

    def ready_all(self, want: int) -> None:
        """Wait for `want` scheduled pods and mark each Ready (the kubelet's part)."""

        def placed() -> bool:
            pods = [p for p in self.pods() if p.spec.node_name]
            for p in pods:
                ready = any(c.type == "Ready" and c.status == "True"
                            for c in (p.status.conditions or []))  # fmt: skip
                if not ready:
                    self.core.patch_namespaced_pod_status(p.metadata.name, self.ns, {"status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True"}]}})  # fmt: skip
            return len(pods) >= want

        wait_for(placed, 60, f"{want} pods of llm scheduled and Ready")
        wait_for(lambda: self._pdb_healthy(want), 30, "the PDB counting the pods")

    def _pdb_healthy(self, want: int) -> bool:
        out = self.kube.kubectl("get", "pdb", "llm", "-n", self.ns, "-o",
                                "jsonpath={.status.currentHealthy}")  # fmt: skip
        return out.stdout.strip() == str(want)

    def ready_now(self) -> int:
        return sum(1 for p in self.pods()
                   if any(c.type == "Ready" and c.status == "True"
                          for c in p.status.conditions or []))  # fmt: skip

    def busiest(self) -> str:
        """The node holding most replicas: the one the test repairs."""
        counts = {n: 0 for n in self.nodes}
        for p in self.pods():
            counts[p.spec.node_name] = counts.get(p.spec.node_name, 0) + 1
        return max(counts, key=lambda n: counts[n])

    def on(self, node: str) -> int:
        return sum(1 for p in self.pods() if p.spec.node_name == node)

    def hpa(self) -> dict[str, Any]:
        kind = "horizontalpodautoscalers"
        return self.custom.get_namespaced_custom_object(*HPA, self.ns, kind, "llm")  # type: ignore[no-any-return]


def condition(kube: Any, node: str) -> Any:
    conds = kube.core().read_node_status(node).status.conditions or []
    return next((c for c in conds if c.type == CONDITION), None)


def node_events(kube: Any, node: str, cluster: Any) -> dict[str, str]:
    cluster.events.flush()
    evs = kube.core().list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
    return {e.reason: e.message for e in evs.items}


def view(cluster: Any, node: str, *codes: str) -> Any:
    """The node as the adapter reads it, with the agent's findings `codes` on gpu:3."""
    findings = [FindingSummary(code=c, component="gpu:3", status=Status.FAILED,
                               action=Action.RESET_GPU, fatal=True) for c in codes]  # fmt: skip
    health = HealthSummary(generated_at=datetime.now(UTC), status=Status.FAILED, findings=findings)
    return dataclasses.replace(cluster.get_node(node), health=health)


@pytest.fixture
def setup(kube: Any, kube_cluster: Any, tmp_path: Path) -> Iterator[Any]:
    kube.start_scheduler()
    kube.start_controllers("disruption", "deployment", "replicaset")

    def make(pool: Pool, **kw: Any) -> tuple[ServingGuard, Any, Any, Path]:
        c = kube_cluster(node_selector=f"fleet={pool.fleet}")
        registry = CollectorRegistry()
        m = build(registry)
        log = tmp_path / f"events-{uuid.uuid4().hex[:4]}.jsonl"
        voice = Announcer(c, dry_run=False, metrics=m, events=EventWriter(log))
        return ServingGuard(c, pool.config(**kw), voice=voice, metrics=m), c, registry, log

    yield make


def drain_op() -> Op:
    """A drain due in an hour from now, made at test time: a deadline stamped at import
    ages while a long suite runs."""
    return Op(OpKind.DRAIN, deadline=datetime.now(UTC) + timedelta(hours=1))


def lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def test_a_drain_is_held_without_room_and_says_so(kube: Any, setup: Any) -> None:
    pool = Pool(kube, replicas=4, max_replicas=4)
    pool.demand(4)
    guard, c, reg, _ = setup(pool)
    node = pool.busiest()
    guard.begin()
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=datetime.now(UTC)) is False
    guard.export()
    cond = condition(kube, node)
    assert cond.status == "True" and cond.reason == "NoRoom", cond
    assert "maxReplicas 4" in cond.message
    held = {"pool": "llm", "reason": "NoRoom"}
    assert reg.get_sample_value("gpuvigil_capacity_held_nodes", held) == 1
    assert pool.desired() == 4 and pool.on(node) >= 1  # nothing scaled, nothing evicted
    pool.demand(1)  # demand falls: H - L >= R, the same step goes, the condition clears
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=datetime.now(UTC)) is True
    assert condition(kube, node).status == "False"


def test_make_before_break_scales_up_waits_proceeds_past_the_pdb_and_restores(
    kube: Any, setup: Any
) -> None:
    pool = Pool(kube, replicas=4, max_replicas=8)
    pool.demand(4)
    guard, c, reg, log = setup(pool)
    node = pool.busiest()
    lost = pool.on(node)
    c.block(node, reason="XID_79")  # as the controller does before it drains
    now = datetime.now(UTC)
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=now) is False  # scaled up
    assert pool.desired() == 4 + lost
    assert pool.hpa()["spec"]["minReplicas"] == 4 + lost  # the HPA would not undo it
    ann = pool.apps.read_namespaced_deployment("llm", pool.ns).metadata.annotations
    assert json.loads(ann[MARK_ANNOTATION])["added"] == lost
    assert condition(kube, node).reason == "WaitingForReplicas"
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=now) is False  # not Ready yet
    pool.ready_all(4 + lost)
    # the pass that begins the drain: its views, read before, still say the node is not
    # disrupted; the state it decided does, so the added replicas stay (the lab saw them
    # restored in the pass that made them, then made again)
    guard.restore([c.get_node(node)], now=datetime.now(UTC), after={node: State.DRAINING})
    assert pool.desired() == 4 + lost
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=datetime.now(UTC)) is True
    # the drain goes through the Eviction API: the 100% PDB refuses every eviction
    st = c.drain(node, deadline=datetime.now(UTC) + timedelta(minutes=5), reason="XID_79")
    guard.drained(c.get_node(node), st, now=datetime.now(UTC))
    assert st.blocked == lost and st.remaining == lost and not st.past_budget
    refused = reg.get_sample_value("gpuvigil_drain_evictions_refused_total", {"pool": "default"})
    assert refused == lost
    # at the deadline what the PDB refused is deleted, and said: Event, metric, event log
    st = c.drain(node, deadline=datetime.now(UTC) - timedelta(seconds=1), reason="XID_79")
    guard.drained(c.get_node(node), st, now=datetime.now(UTC))
    assert len(st.past_budget) == lost and st.forced == lost
    forced = reg.get_sample_value("gpuvigil_drain_pdb_overridden_total", {"pool": "default"})
    assert forced == lost
    told = node_events(kube, node, c)["DisruptionBudgetOverridden"]
    assert "PodDisruptionBudget refused" in told
    said = [e for e in lines(log) if e["data"].get("result") == "pdb-overridden"]
    assert said and said[0]["node"] == node and len(said[0]["data"]["pods"]) == lost
    # the replicaset replaces them elsewhere; once the node's disruption is over: restore
    pool.ready_all(4 + lost)
    wait_for(lambda: pool.on(node) == 0, 30, "no replica left on the drained node")
    guard.restore([c.get_node(node)], now=datetime.now(UTC))
    assert pool.desired() == 4 and pool.hpa()["spec"]["minReplicas"] == 1
    ann = pool.apps.read_namespaced_deployment("llm", pool.ns).metadata.annotations or {}
    assert MARK_ANNOTATION not in ann
    assert any(e["data"].get("result") == "restored" for e in lines(log))


def test_a_missing_signal_holds_then_escalates(kube: Any, setup: Any) -> None:
    pool = Pool(kube, replicas=3, max_replicas=8, nodes=2)
    pool.demand(None)  # the HPA has no desiredReplicas (never computed)
    guard, c, reg, _ = setup(pool, escalate_after_s=600)
    node = pool.busiest()
    t0 = datetime.now(UTC)
    guard.begin()
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=t0) is False
    guard.export()
    assert condition(kube, node).reason == "DemandSignalMissing"
    assert reg.get_sample_value("gpuvigil_capacity_escalated_nodes", {"pool": "llm"}) == 0
    assert pool.desired() == 3  # nothing scaled on a missing signal
    pool.demand(3, active="False")  # the HPA runs but cannot read its metrics: still missing
    guard.begin()  # ten minutes later, still no signal: escalated
    later = t0 + timedelta(seconds=601)
    assert guard.allow(view(c, node, "XID_79"), drain_op(), now=later) is False
    guard.export()
    assert reg.get_sample_value("gpuvigil_capacity_escalated_nodes", {"pool": "llm"}) == 1
    assert "CapacityHoldEscalated" in node_events(kube, node, c)


def test_suspected_corruption_bypasses_the_gate_with_an_audit_event(kube: Any, setup: Any) -> None:
    pool = Pool(kube, replicas=2, max_replicas=2, nodes=2)
    pool.demand(2)  # no room at all
    guard, c, reg, log = setup(pool)
    node = pool.busiest()
    assert guard.allow(view(c, node, "GPU_SDC"), drain_op(), now=datetime.now(UTC)) is True
    audit = [e for e in lines(log) if e["data"].get("result") == "bypassed"]
    assert audit and audit[0]["data"]["audit"] is True and "GPU_SDC" in audit[0]["data"]["reason"]
    assert "GPU_SDC" in node_events(kube, node, c)["CapacityGateBypassed"]
    bypass = {"pool": "llm", "verdict": "bypass"}
    assert reg.get_sample_value("gpuvigil_capacity_gate_total", bypass) == 1


def test_the_controller_repairs_a_serving_node_without_going_below_demand(
    kube: Any, kube_cluster: Any, agent: Any, tmp_path: Path
) -> None:
    """The whole loop: a fatal Xid on a node holding replicas; the controller blocks it,
    scales the pool up before it drains, forces past the 100% PDB at the deadline (said),
    resets the GPU and restores the replicas. Ready replicas never fall below demand."""
    from gpuvigil.platform.controller import Controller, ControllerConfig
    from gpuvigil.platform.policy import PolicyConfig
    from gpuvigil.platform.safety import SafetyConfig
    from gpuvigil.platform.state import State, decode_record

    kube.start_scheduler()
    kube.start_controllers("disruption", "deployment", "replicaset")
    pool = Pool(kube, replicas=4, max_replicas=8)
    pool.demand(4)
    for n in pool.nodes:
        agent.publish(n)
    bad = pool.busiest()
    agent.publish(bad, FATAL)
    c = kube_cluster(node_selector=f"fleet={pool.fleet}")
    log = tmp_path / "controller.jsonl"
    cfg = ControllerConfig(
        policy=PolicyConfig(fatal_grace_s=0, drain_timeout_s=2),
        safety=SafetyConfig(max_disrupted=5, max_disrupted_percent=100),
        serving=pool.config(),
    )
    ctl = Controller(c, config=cfg, events=EventWriter(log))
    low, peak, states = 99, 0, []
    for _ in range(60):
        ctl.reconcile()
        low = min(low, pool.ready_now())  # Ready and not terminating, anywhere
        peak = max(peak, pool.desired())
        ann = kube.core().read_node(bad).metadata.annotations or {}
        rec = decode_record(ann.get("gpuvigil.io/state"))
        if rec and (not states or states[-1] != rec.state):
            states.append(rec.state)
        if rec and rec.state is State.HEALTHY and pool.desired() == 4:
            break
        pool.ready_all(len([p for p in pool.pods() if p.spec.node_name]))
        agent.step(bad)
    assert states[:2] == [State.DRAINING, State.REMEDIATING], states
    assert State.HEALTHY in states and pool.desired() == 4  # restored
    assert peak > 4 and low >= 4, (peak, low)  # made before it broke; never below demand
    kinds = [(e["data"].get("action"), e["data"].get("result")) for e in lines(log)]
    assert ("CAPACITY", "scale-up") in kinds and ("DRAIN", "pdb-overridden") in kinds
    assert ("CAPACITY", "restored") in kinds
