"""What a whole-gang restart costs the control plane as the gang grows: seconds to delete a
gang's pods and to create and bind its next attempt, on a real kube-apiserver, etcd,
kube-scheduler and kube-controller-manager (its Job controller) at their default client
rate limits, for gangs of N one-pod-per-node ranks on N fake 8-GPU Nodes.

This is the size term of the simulator's cold-restart model (`sim/restart_phases.yaml`,
the stop and reschedule phases' `per_pod_s`): the lab's 2-rank restart measures the
phases, this measures how stop and reschedule grow with pods. The baseline is the smallest
gang of the same run; each larger gang is printed as its seconds per pod over the
baseline's, so a ratio near 1 says the cost is linear in pods (a rate limit), above 1 that
something grows faster.

    PYTHONPATH=src python bench/gang_reschedule.py            # 32, 256 and 1024 pods
    PYTHONPATH=src python bench/gang_reschedule.py 64 2048
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config

from gpuvigil.lab.control_plane import ControlPlane, missing

NS = "bench"
GPUS = 8


def add_nodes(api: client.CoreV1Api, n: int) -> None:
    for i in range(n):
        name = f"gpu-{i:05d}"
        api.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        cap = {"cpu": "192", "memory": "2000Gi", "pods": "110", "nvidia.com/gpu": str(GPUS)}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        api.patch_node_status(
            name, {"status": {"capacity": cap, "allocatable": cap, "conditions": [ready]}}
        )
        # admission taints a new Node not-ready; its kubelet's first Ready status would
        # have the node lifecycle controller lift it (not run here: the bench lifts it)
        api.patch_node(name, {"spec": {"taints": []}})


def job(name: str, n: int) -> dict[str, Any]:
    pod = {
        "metadata": {"labels": {"gang": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "rank", "image": "registry.invalid/train:1",
                "resources": {"limits": {"nvidia.com/gpu": str(GPUS)}},
            }],
        },
    }  # fmt: skip
    return {
        "metadata": {"name": name},
        "spec": {"parallelism": n, "completions": n, "backoffLimit": 0, "template": pod},
    }


def pods(api: client.CoreV1Api, name: str) -> list[Any]:
    return api.list_namespaced_pod(NS, label_selector=f"gang={name}").items


def wait(what: str, pred: Any, timeout_s: float) -> float:
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - t0


def gang(api: client.CoreV1Api, batch: client.BatchV1Api, n: int) -> dict[str, float]:
    """Seconds to create and bind a gang of `n` pods (its first attempt), then to restart it
    as JobSet does (its failure policy recreates the gang's Jobs): the old Job deleted in
    the foreground, so the garbage collector deletes every pod first, then the new Job's
    pods created by the Job controller and bound by the scheduler."""

    def bound(job_name: str) -> Any:
        def pred() -> bool:
            ps = pods(api, job_name)
            live = [p for p in ps if p.metadata.deletion_timestamp is None]
            return len(live) == n and all(p.spec.node_name for p in live)

        return pred

    def gone(job_name: str) -> Any:
        def pred() -> bool:
            return not pods(api, job_name) and not batch.list_namespaced_job(
                NS, field_selector=f"metadata.name={job_name}").items  # fmt: skip

        return pred

    old, new = f"gang-{n}-a1", f"gang-{n}-a2"
    batch.create_namespaced_job(NS, job(old, n))
    first = wait(f"{old} bound", bound(old), 60 + n)
    t1 = time.monotonic()
    batch.delete_namespaced_job(old, NS, propagation_policy="Foreground")
    deleted = wait(f"{old} deleted", gone(old), 60 + n)
    batch.create_namespaced_job(NS, job(new, n))
    rebound = wait(f"{new} bound", bound(new), 60 + n)
    restart = time.monotonic() - t1
    batch.delete_namespaced_job(new, NS, propagation_policy="Foreground")
    wait(f"{new} cleared", gone(new), 60 + n)
    return {"first": first, "delete": deleted, "recreate": rebound, "restart": restart}


def main() -> int:
    sizes = [int(a) for a in sys.argv[1:]] or [32, 256, 1024]
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # loopback, self-signed
    why = missing()
    if why:
        print(f"gang_reschedule: {why}")
        return 2
    with tempfile.TemporaryDirectory(prefix="gpuvigil-bench-gang-") as tmp:
        cp = ControlPlane(Path(tmp), controllers="job,garbagecollector")
        cp.start()
        try:
            api_client = config.new_client_from_config(str(cp.kubeconfig))
            api, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
            api.create_namespace({"metadata": {"name": NS}})
            add_nodes(api, max(sizes))
            print(f"load average at start: {os.getloadavg()[0]:.1f}; Kubernetes 1.20.2 defaults "
                  "(kube-controller-manager --kube-api-qps 20, kube-scheduler 50)")  # fmt: skip
            print(f"{'pods':>6} {'first bind':>11} {'delete':>8} {'recreate+bind':>14} "
                  f"{'restart':>8} {'s/pod':>7} {'x base':>7}")  # fmt: skip
            base = None
            for n in sorted(sizes):
                r = gang(api, batch, n)
                per_pod = r["restart"] / n
                base = base or per_pod
                print(f"{n:>6} {r['first']:>10.1f}s {r['delete']:>7.1f}s {r['recreate']:>13.1f}s "
                      f"{r['restart']:>7.1f}s {per_pod:>7.3f} {per_pod / base:>7.2f}")  # fmt: skip
        finally:
            cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
