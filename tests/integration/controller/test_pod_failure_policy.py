# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""The shipped training Job and its podFailurePolicy against the real kube-apiserver, and the
seam it relies on: a pod gpuvigil's drain evicts carries DisruptionTarget on its last state
(set before the eviction), so the policy spares it, even when the pod is gone at once."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from ctl_helpers import kube_cluster  # noqa: F401  (fixture)

from gpuvigil.core import exit_codes
from gpuvigil.core.findings import utcnow

pytestmark = pytest.mark.realparts
EXAMPLE = Path(__file__).resolve().parents[3] / "deploy/kubernetes/examples/training-job.yaml"
POLICY_MIN = (1, 26)  # podFailurePolicy: alpha 1.25, beta (on by default) 1.26, GA 1.31


def server_version(kube: Any) -> tuple[int, int]:
    from kubernetes import client

    v = client.VersionApi(kube.api_client()).get_code()
    return int(v.major), int("".join(ch for ch in v.minor if ch.isdigit()))


def test_the_example_job_is_accepted_as_written(kube) -> None:  # type: ignore[no-untyped-def]
    """Server-side dry run, then for real. A server that knows podFailurePolicy keeps it as
    the exit-code table gives it; 1.20 (these tests' server) predates it and drops it, which
    this test says out loud so that a newer server turns it into the strict check."""
    from kubernetes.dynamic import DynamicClient

    job = yaml.safe_load(EXAMPLE.read_text())
    ns = kube.namespace("pfp")
    api = DynamicClient(kube.api_client()).resources.get(api_version="batch/v1", kind="Job")
    api.create(body=job, namespace=ns, query_params=[("dryRun", "All")])
    stored = api.create(body=job, namespace=ns).to_dict()
    tmpl = stored["spec"]["template"]["spec"]
    assert tmpl["restartPolicy"] == "Never"
    assert tmpl["containers"][0]["name"] == "trainer"
    assert stored["spec"]["backoffLimit"] == job["spec"]["backoffLimit"]
    if server_version(kube) >= POLICY_MIN:
        assert stored["spec"]["podFailurePolicy"] == exit_codes.pod_failure_policy(
            container="trainer"
        )
    else:
        assert "podFailurePolicy" not in stored["spec"]  # pruned: unknown to this server


def test_an_evicted_pods_last_state_is_spared_by_the_policy(kube, kube_cluster) -> None:  # type: ignore[no-untyped-def]
    """With a grace period of 0 the pod is gone with the eviction: a DisruptionTarget written
    after it would get a 404 (the old order). The pod's last state, as a Job controller sees
    it in the DELETED event, must already carry it."""
    from kubernetes import watch

    node = kube.create_node(f"gpu-pfp-{uuid.uuid4().hex[:6]}", labels={"pfp": "1"})
    ns = kube.namespace("pfp")
    pod = kube.create_running_pod(node, namespace=ns, name="train-0")
    core = kube.core()
    seen: list[tuple[str, dict[str, Any]]] = []
    ready = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        ready.set()
        for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=30,
                           _request_timeout=35):  # fmt: skip
            seen.append((ev["type"], ev["raw_object"]))
            if ev["type"] == "DELETED":
                w.stop()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    ready.wait(5)
    c = kube_cluster(node_selector="pfp=1", eviction_grace_s=0)
    st = c.drain(node, deadline=utcnow() + timedelta(seconds=60), reason="XID_79 gpu:3")
    t.join(35)
    assert st.blocked == 0
    deleted = [obj for kind, obj in seen if kind == "DELETED"]
    assert deleted, f"the pod {pod} was not deleted: {[k for k, _ in seen]}"
    status = deleted[-1]["status"]
    conds = {c["type"]: c for c in status.get("conditions") or []}
    assert conds["DisruptionTarget"]["status"] == "True"
    assert "XID_79" in conds["DisruptionTarget"]["message"]
    # However the pod's container ended, the shipped policy retries it for free.
    status["containerStatuses"] = [{"name": "trainer", "state": {"terminated": {"exitCode": 143}}}]
    policy = yaml.safe_load(EXAMPLE.read_text())["spec"]["podFailurePolicy"]
    assert exit_codes.policy_action(policy, status) == "Ignore"
