"""One fault's episode in a running lab: which node it hits, what it does to it, and when
the lab has dealt with it. Functions of `run.Lab` (its machines, kubelets, job and what
its follower has seen)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gpuvigil.lab import faults
from gpuvigil.lab.kubelet import ranks_on
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
    return max(nodes, key=lambda n: (-lab.hits.count(n), n))


def inject(lab: Lab) -> str:
    node = lab.target = pick_target(lab)
    if node in lab.follow.gone:
        raise EpisodeError(f"{node} was replaced by an earlier fault; nothing left to break")
    lab.hits.append(node)
    m = lab.machines[node]
    lab.follow.fault_ts = time.time()
    if lab.fault in faults.GPU_FAULTS:
        gpu = 3
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
    in_service = f.states.get(node, "HEALTHY") == "HEALTHY" and not f.blocked(node)
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
