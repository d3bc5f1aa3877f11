"""How soon the real Job controller (kube-controller-manager 1.20.2) recreates a rank's pod,
the figure the simulator charges a kept-survivors restart (`SimConfig.pod_failure_backoff_s`,
docs/simulator.md): a pod deleted by a drain, and a pod that failed on its own (a crash),
the first failure of a long-running job. The test plays the kubelet (the pod's phase)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from ctl_helpers import wait_for

pytestmark = pytest.mark.realparts


def _job(name: str, tag: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": 1, "completions": 1, "backoffLimit": 6, "template": {
            "metadata": {"labels": {"job": name}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"fleet": tag},
                     "containers": [{"name": "trainer", "image": "x"}]},
        }},
    }  # fmt: skip


def _live(v1: Any, ns: str, name: str) -> list[Any]:
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
        new[:] = [p.metadata.name for p in _live(v1, ns, name) if p.metadata.name != old]
        return bool(new)

    wait_for(came, 120, f"a new pod for {name}")
    return time.monotonic() - t0


def test_the_job_controller_recreates_a_drained_pod_at_once_and_a_failed_one_after_its_back_off(
    kube: Any,
) -> None:
    from kubernetes import client

    kube.start_controllers("job")
    tag = uuid.uuid4().hex[:6]
    kube.create_node(f"jc-{tag}", labels={"fleet": tag})
    v1, ns = kube.core(), kube.namespace()
    batch = client.BatchV1Api(kube.api_client())
    figures = {}
    for how in ("drained", "failed"):
        name = f"{how}-{tag}"
        batch.create_namespaced_job(ns, _job(name, tag))
        wait_for(lambda n=name: len(_live(v1, ns, n)) == 1, 60, f"{name}'s pod")
        (pod,) = _live(v1, ns, name)
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
    (pod,) = _live(v1, ns, name)
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
