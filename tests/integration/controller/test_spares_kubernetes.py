# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""Hot spares on a real kube-apiserver 1.20.2 with the real kube-scheduler and the real
Job controller (kube-controller-manager): the controller keeps one validated idle node as
a spare (taint `gpuvigil.io/spare:NoSchedule` + label); an ordinary pod never lands on it;
a gang Job's pods (tolerating the taint, preferring other nodes) start on the other nodes;
when one of their nodes fails, the controller drains it, the Job controller recreates the
lost pod and the scheduler binds it to the spare, with the Job never failed or requeued;
the used spare is given back and a new node becomes the spare. The test plays the nodes'
kubelets (pods are marked Running) and agents. Prints the measured times."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from ctl_helpers import FATAL, agent, kube_cluster, wait_for  # noqa: F401

from gpuvigil.core import wire
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.spares import SpareConfig

pytestmark = pytest.mark.realparts

# The shipped example's scheduling of a gang job's pods: it tolerates the spare taint (a
# lost rank's replacement may land on a spare) and prefers other nodes (spares stay free).
EXAMPLE = Path(__file__).resolve().parents[3] / "deploy/kubernetes/examples/training-job.yaml"
SHIPPED = yaml.safe_load(EXAMPLE.read_text())["spec"]["template"]["spec"]


def gang_job(name: str, tag: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0, "template": {
            "metadata": {"labels": {"job": name}},
            "spec": {
                "restartPolicy": "Never", "nodeSelector": {"fleet": tag},
                "tolerations": SHIPPED["tolerations"], "affinity": SHIPPED["affinity"],
                "containers": [{"name": "trainer", "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            },
        }},
    }  # fmt: skip


def bound(v1: Any, ns: str, name: str) -> dict[str, str]:
    """pod -> node of the job's live pods that the scheduler bound."""
    pods = v1.list_namespaced_pod(ns, label_selector=f"job={name}").items
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if p.spec.node_name and p.metadata.deletion_timestamp is None
    }


def mark_running(v1: Any, ns: str, pods: list[str]) -> None:
    for pod in pods:  # the kubelet's part
        v1.patch_namespaced_pod_status(pod, ns, {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}]}})  # fmt: skip


def test_a_lost_rank_moves_to_the_spare_and_the_spare_is_refilled(
    kube: Any, kube_cluster: Any, agent: Any
) -> None:
    from kubernetes import client

    kube.start_scheduler()
    kube.start_controllers("job")
    tag = uuid.uuid4().hex[:6]
    v1 = kube.core()
    nodes = [kube.create_node(f"gpu-{tag}-{i}", labels={"fleet": tag}) for i in range(3)]
    for n in nodes:
        agent.publish(n)
    config = ControllerConfig(
        policy=PolicyConfig(fatal_grace_s=0),
        spares=SpareConfig(default=1),
    )
    ctl = Controller(kube_cluster(node_selector=f"fleet={tag}"), config=config)
    r = ctl.reconcile()
    spare = nodes[0]  # the first by name (no machine has past episodes)
    assert r.spares is not None and r.spares.spares == {"default": 1}
    raw = v1.read_node(spare)
    assert (raw.metadata.labels or {}).get(wire.SPARE_TAINT) == "true"
    assert any(t.key == wire.SPARE_TAINT for t in raw.spec.taints or [])

    ns = kube.namespace()
    batch = client.BatchV1Api(kube.api_client())
    batch.create_namespaced_job(ns, gang_job("gang", tag))
    wait_for(lambda: len(bound(v1, ns, "gang")) == 2, 60, "the gang's two pods bound")
    first = bound(v1, ns, "gang")
    assert spare not in first.values(), first  # the gang left the spare free
    mark_running(v1, ns, list(first))
    # Ordinary work (no toleration) never lands on the spare, even with nowhere else.
    why = kube.unschedulable_pod(ns, node_selector={"fleet": tag, wire.SPARE_TAINT: "true"})
    assert "taint" in why, why

    victim = next(iter(first.values()))
    lost = next(p for p, n in first.items() if n == victim)
    t_fault = time.monotonic()
    agent.publish(victim, FATAL)  # the agent reports an Xid 79 on one of the gang's nodes
    t_drained = None
    moved: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ctl.reconcile()
        now = bound(v1, ns, "gang")
        if t_drained is None and lost not in now:
            t_drained = time.monotonic()
        moved = {p: n for p, n in now.items() if p not in first}
        if moved:
            break
        time.sleep(0.1)
    t_bound = time.monotonic()
    assert list(moved.values()) == [spare], (moved, now)
    assert t_drained is not None
    print(f"\nfault reported -> lost pod gone (drained): {t_drained - t_fault:.2f} s; "
          f"-> replacement bound on the spare: {t_bound - t_fault:.2f} s "
          f"(drain -> bound {t_bound - t_drained:.2f} s)")  # fmt: skip
    job = batch.read_namespaced_job("gang", ns)
    assert not job.status.failed, job.status  # the slot was kept: no failure counted
    survivor = next(p for p in first if p != lost)
    assert survivor in bound(v1, ns, "gang")  # the other rank's pod was never touched

    # The used spare is the job's node now; the pool is short until a node is free.
    mark_running(v1, ns, list(moved))
    r = ctl.reconcile()
    assert r.spares is not None and r.spares.spares == {"default": 0}
    assert not any(t.key == wire.SPARE_TAINT for t in v1.read_node(spare).spec.taints or [])
    fresh = kube.create_node(f"gpu-{tag}-3", labels={"fleet": tag})
    agent.publish(fresh)
    t_new = time.monotonic()

    def refilled() -> bool:
        plan = ctl.reconcile().spares  # the busy node 0 is tried once, then node 3
        return plan is not None and plan.spares == {"default": 1}

    wait_for(refilled, 30, "a new spare")
    print(f"refilled from a validated idle node in {time.monotonic() - t_new:.2f} s")
    assert any(t.key == wire.SPARE_TAINT for t in v1.read_node(fresh).spec.taints or [])


def test_a_throttled_node_s_rank_moves_to_the_spare_and_the_node_stays_quarantined(
    kube: Any, kube_cluster: Any, agent: Any
) -> None:
    """A GPU in hardware thermal slowdown (INVESTIGATE: quarantined for a person) slows the
    whole gang while its rank runs there: the controller evicts that pod once the spare
    stands by, the Job controller recreates it and the scheduler binds it to the spare; the
    node stays QUARANTINED, the other rank is never touched, the Job counts no failure."""
    from kubernetes import client

    from gpuvigil.core.findings import Action, Status
    from gpuvigil.core.wire import FindingSummary
    from gpuvigil.platform.state import State

    hot = FindingSummary(code="THERMAL_SLOWDOWN", component="gpu:5", status=Status.FAILED,
                         action=Action.INVESTIGATE, check="gpu")  # fmt: skip
    kube.start_scheduler()
    kube.start_controllers("job")
    tag = uuid.uuid4().hex[:6]
    v1 = kube.core()
    nodes = [kube.create_node(f"hot-{tag}-{i}", labels={"fleet": tag}) for i in range(3)]
    for n in nodes:
        agent.publish(n)
    config = ControllerConfig(policy=PolicyConfig(fatal_grace_s=0), spares=SpareConfig(default=1))
    cluster = kube_cluster(node_selector=f"fleet={tag}")
    ctl = Controller(cluster, config=config)
    ctl.reconcile()
    spare = nodes[0]
    ns = kube.namespace()
    batch = client.BatchV1Api(kube.api_client())
    batch.create_namespaced_job(ns, gang_job("hotgang", tag))
    wait_for(lambda: len(bound(v1, ns, "hotgang")) == 2, 60, "the gang's two pods bound")
    first = bound(v1, ns, "hotgang")
    mark_running(v1, ns, list(first))
    victim = next(iter(first.values()))
    lost = next(p for p, n in first.items() if n == victim)
    agent.publish(victim, hot)
    states: list[State] = []
    moved: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not moved:
        states.append(ctl.reconcile().decisions[victim].state)
        moved = {p: n for p, n in bound(v1, ns, "hotgang").items() if p not in first}
        time.sleep(0.1)
    assert list(moved.values()) == [spare], (moved, states)
    assert lost not in bound(v1, ns, "hotgang")
    assert set(states) == {State.QUARANTINED}, states  # never drained through the ladder
    view = next(v for v in cluster.list_nodes() if v.name == victim)
    assert view.record is not None and view.record.state is State.QUARANTINED
    assert view.blocked_by_us  # still blocked for its person
    assert not batch.read_namespaced_job("hotgang", ns).status.failed
    survivor = next(p for p in first if p != lost)
    assert survivor in bound(v1, ns, "hotgang")


def _single_job(name: str, tag: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6, "template": {
            "metadata": {"labels": {"job": name}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"fleet": tag},
                     "containers": [{"name": "trainer", "image": "x"}]},
        }},
    }  # fmt: skip


def _live_pods(v1: Any, ns: str, name: str) -> list[Any]:
    pods = v1.list_namespaced_pod(ns, label_selector=f"job={name}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None
            and p.status.phase not in ("Failed", "Succeeded")]  # fmt: skip


def _running(v1: Any, ns: str, pod: str) -> None:
    v1.patch_namespaced_pod_status(pod, ns, {"status": {"phase": "Running"}})


def _replaced_after(v1: Any, ns: str, name: str, old: str, act: Any) -> float:
    t0 = time.monotonic()
    act()
    new: list[str] = []

    def came() -> bool:
        new[:] = [p.metadata.name for p in _live_pods(v1, ns, name) if p.metadata.name != old]
        return bool(new)

    wait_for(came, 120, f"a new pod for {name}")
    return time.monotonic() - t0


def test_the_job_controller_recreates_a_drained_pod_at_once_and_a_failed_one_after_its_back_off(
    kube: Any,
) -> None:
    """How soon the real Job controller recreates a rank's pod, the figure the simulator
    charges a kept-survivors restart (`SimConfig.pod_failure_backoff_s`, docs/simulator.md):
    a pod deleted by a drain, and a pod that failed on its own (a crash), the first failure
    of a long-running job, then a second in a row. The test plays the kubelet."""
    from kubernetes import client

    kube.start_controllers("job")
    tag = uuid.uuid4().hex[:6]
    kube.create_node(f"jc-{tag}", labels={"fleet": tag})
    v1, ns = kube.core(), kube.namespace()
    batch = client.BatchV1Api(kube.api_client())
    figures = {}
    for how in ("drained", "failed"):
        name = f"{how}-{tag}"
        batch.create_namespaced_job(ns, _single_job(name, tag))
        wait_for(lambda n=name: len(_live_pods(v1, ns, n)) == 1, 60, f"{name}'s pod")
        (pod,) = _live_pods(v1, ns, name)
        _running(v1, ns, pod.metadata.name)
        time.sleep(1.0)  # running for a while, as a rank is before its fault

        def drain(p: str = pod.metadata.name) -> None:
            v1.delete_namespaced_pod(p, ns, grace_period_seconds=0)

        def fail(p: str = pod.metadata.name) -> None:
            v1.patch_namespaced_pod_status(p, ns, {"status": {"phase": "Failed",
                "containerStatuses": [{"name": "trainer", "image": "x", "imageID": "",
                                       "ready": False, "restartCount": 0,
                                       "state": {"terminated": {"exitCode": 1}}}]}})  # fmt: skip

        figures[how] = _replaced_after(v1, ns, name, pod.metadata.name,
                                       drain if how == "drained" else fail)  # fmt: skip
    # a second failure in a row: the back-off the Job docs describe (10 s, doubling)
    name = f"failed-{tag}"
    (pod,) = _live_pods(v1, ns, name)
    _running(v1, ns, pod.metadata.name)
    again = _replaced_after(v1, ns, name, pod.metadata.name, lambda: fail(pod.metadata.name))
    figures["failed again"] = again
    shown = ", ".join(f"{k} {v:.2f} s" for k, v in figures.items())
    print(f"\nJob controller 1.20.2, pod recreated after: {shown}")
    # A drained rank's pod comes back at once, and a crashed one's first failure too on
    # 1.20 (later versions wait 10 s, which the simulator charges: `pod_failure_backoff_s`);
    # a failure in a row waits the back-off, never a minute.
    assert figures["drained"] < 5.0 and figures["failed"] < 12.0, figures
    assert figures["failed again"] < 60.0, figures
