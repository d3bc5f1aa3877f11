"""One fault's episode in a running lab: which node it hits, what it does to it, and when
the lab has dealt with it. Functions of `run.Lab` (its machines, kubelets, job and what
its follower has seen).

A per-GPU fault (`faults.FaultKind.per_gpu`) first gets a holder: a 1-GPU pod on the
target node, on the GPU the job's pods left free there, which the fault then hits; its
episode ends with that GPU isolated and the holder gone, while the job runs on.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpuvigil.core import holders
from gpuvigil.lab import faults
from gpuvigil.lab.kubelet import GPU_RESOURCE, gpus_of, ranks_on
from gpuvigil.lab.parts import NAMESPACE
from gpuvigil.lab.procs import environ

if TYPE_CHECKING:
    from gpuvigil.lab.run import Lab


class EpisodeError(RuntimeError):
    """The fault could not be injected; the message says why."""


def pick_target(lab: Lab) -> str:
    """A node running the job, the one broken least often in this lab (a node broken
    again soon after a ladder step goes on up its ladder: another test). For rank-hang,
    one whose rank is not 0: rank 0 hosts the job's store, and a frozen store host is
    another fault (`--on` that node shows it)."""
    if lab.on is not None:
        return lab.on
    assert lab.job is not None
    nodes = sorted(set(lab.job.attempts[-1].nodes.values())) or lab.names
    if lab.fault == "rank-hang":
        for node in nodes:
            ranks = {environ(pid).get("RANK") for pid in ranks_on(lab.kubelets[node])}
            if ranks and "0" not in ranks:
                return node
    serving = lab.serving.on if lab.serving is not None else (lambda n: 0)
    # with a serving workload, the job's node holding most replicas: make-before-break's case
    return max(nodes, key=lambda n: (serving(n), -lab.hits.count(n), n))


def holder_pod(name: str, node: str) -> dict[str, object]:
    """A pod holding one GPU of `node` (the pause image: it does nothing until stopped)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "lab-gpu-holder"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "holder", "image": "registry.k8s.io/pause:3.2",
                            "resources": {"limits": {GPU_RESOURCE: "1"}}}],
        },
    }  # fmt: skip


def place_holder(lab: Lab, name: str) -> int:
    """The holder of a per-GPU fault's GPU: scheduled onto the target node, running, and
    named for its GPU in the agent's gpu-holders annotation (what the controller reads).
    Returns that GPU's index."""
    node = lab.target = pick_target(lab)
    lab.api.create_namespaced_pod(NAMESPACE, holder_pod(name, node))
    key = f"{NAMESPACE}/{name}"
    lab.follow.watched[key] = node
    lab.follow.add("pod", node, f"pod {key} asks for 1 GPU (the holder of the GPU to break)")

    def published() -> bool:
        kubelet = lab.kubelets[node]
        uuids = {g.index: g.uuid for g in kubelet.machine.fake_node().gpus}
        got = gpus_of(kubelet, NAMESPACE, name)
        ann = lab.api.read_node(node).metadata.annotations or {}
        msg, _ = holders.decode(ann.get(holders.HOLDERS_ANNOTATION))
        return bool(got) and msg is not None and key in msg.holders.get(uuids[got[0]], [])

    lab._until(published, 60, f"{key} running on {node} and in its gpu-holders annotation")
    (gpu,) = gpus_of(lab.kubelets[node], NAMESPACE, name)
    lab.follow.add("pod", node, f"pod {key} holds gpu:{gpu} (the agent published it)")
    return gpu


def inject(lab: Lab, *, gpu: int = 3) -> str:
    node = lab.target = lab.target or pick_target(lab)
    if node in lab.follow.gone:
        raise EpisodeError(f"{node} was replaced by an earlier fault; nothing left to break")
    lab.hits.append(node)
    m = lab.machines[node]
    lab.follow.fault_ts = time.time()
    if lab.fault in faults.GPU_FAULTS:
        line = faults.GPU_FAULTS[lab.fault](m, gpu)
        detail = f"{faults.KINDS[lab.fault].summary}; gpu:{gpu}; kernel log: {line}"
    elif lab.fault == "rank-hang":
        pids = ranks_on(lab.kubelets[node])
        if not pids:
            raise EpisodeError(f"no training rank runs on {node} to hang")
        for pid in pids:
            faults.stop_process(pid)
        detail = f"rank process(es) {pids} stopped (SIGSTOP)"
    else:
        m.kill_agent()
        detail = f"agent pid {m.agent.pid if m.agent else '?'} killed (SIGKILL)"
    lab.follow.add("fault", node, detail, ts=lab.follow.fault_ts)
    lab.say(f"fault {lab.fault} injected on {node}; following it")
    return node


def settled(lab: Lab) -> bool:
    assert lab.job is not None and lab.target is not None
    if lab.job.state == "Running":
        return False
    node, f = lab.target, lab.follow
    if node in f.gone or f.states.get(node) == "QUARANTINED":
        return True
    if faults.KINDS[lab.fault].per_gpu and f.isolated.get(node) == "isolated":
        return all(key in f.pods_gone for key in f.watched)  # its holder evicted
    in_service = f.states.get(node, "HEALTHY") == "HEALTHY" and not f.blocked(node)
    if lab.serving is not None and not lab.serving.restored():
        return False  # the replicas added for the repair are not back yet
    if lab.fault == "rank-hang":
        return in_service
    return in_service and node in f.left_service


def in_service(lab: Lab) -> bool:
    """Every node still in the lab healthy (validated, when it was remediated) and
    unblocked: a fault after this finds the lab as the first one did."""
    f = lab.follow
    return all(
        f.states.get(n, "HEALTHY") == "HEALTHY" and not f.blocked(n)
        for n in lab.names
        if n not in f.gone
    )
