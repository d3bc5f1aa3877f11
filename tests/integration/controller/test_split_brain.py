"""Two controllers, one with its clock 20 s ahead, on a real kube-apiserver: they never both
act and never exceed the disruption budget, through a paused leader, its resumption and a
killed leader. Evidence from the API server's own audit log (its clock, its order): every
write of a replica was received while the Lease named that replica holder, and replaying
the stored records never puts more nodes in the budget than it allows.

This is the failure the issue measured (a standby 20 s ahead saw the leader's renewTime as
old and took over: two leaders, 4 nodes in a budget of 2); test_split_brain_slurm.py is the
same on real Slurm."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FATAL, Agent, wait_for
from split_brain import max_in_budget, run_disruptions, start

from gpuvigil.core.wire import decode_time
from gpuvigil.platform.state import STATE_ANNOTATION, State, decode_record
from realparts.kube import AUDITED

pytestmark = pytest.mark.realparts

NODES, BUDGET = 8, 2
LEASE = "{duration_s: 6, renew_deadline_s: 4, retry_s: 0.5}"
WRITES = ("create", "update", "patch", "delete")


def config(tmp_path: Path, *, tag: str, lease_ns: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(
        f"""controller:
  cluster: kubernetes
  interval_s: 0.5
  metrics_port: 0
  leader_election: true
  lease: {LEASE}
  # the agents break the same nodes again on purpose: machine memory stays out, or the
  # third episode makes each a lemon and REPLACE deletes the test's nodes
  policy: {{drain_timeout_s: 3600, cooldown_s: 0, escalation_window_s: 0, fatal_grace_s: 0,
           lemon_episodes: 1000000, flap_count: 1000000, useless_step_after: 1000000}}
  safety:
    max_disrupted: {BUDGET}
    max_disrupted_percent: 100
    breaker_min_nodes: 1000000000  # the breaker stays out: every node is faulty on purpose
    breaker_stale_min_nodes: 1000000000
  kubernetes:
    node_selector: fleet={tag}
    pool_gpus: {{default: 8}}  # a validation's GPU count is the controller's
    lease_namespace: {lease_ns}
    eviction_grace_s: 0
"""
    )
    return path


class SlowAgent(threading.Thread):
    """The agents of all nodes: answer a request 2 s after it came (the repair takes a
    while, so repairs are in flight across the leader changes), preflight when asked, and
    while `rebreak` is set, a repaired node faults again (work for whoever leads)."""

    def __init__(self, kube: Any, nodes: list[str]) -> None:
        super().__init__(daemon=True)
        kube.ensure_preflight_template()  # the controller's preflight runs come from it
        self.agent, self.nodes = Agent(kube.core(), kube), nodes
        self.seen: dict[str, float] = {}
        self.stop, self.rebreak = threading.Event(), threading.Event()
        self.rebreak.set()

    def run(self) -> None:
        from gpuvigil.core import wire

        while not self.stop.is_set():
            for n in self.nodes:
                try:
                    ann = self.agent.core.read_node(n).metadata.annotations or {}
                    rec = decode_record(ann.get(STATE_ANNOTATION))
                    if self.rebreak.is_set() and rec and rec.state is State.HEALTHY:
                        self.agent.publish(n, FATAL)
                        continue
                    req = ann.get(wire.REQUEST_ANNOTATION)
                    if req and self.seen.setdefault(req, time.monotonic()) > time.monotonic() - 2:
                        continue
                    self.agent.step(n)
                except Exception:  # a conflict with the controller: next round
                    pass
            self.stop.wait(0.3)


def test_two_controllers_20s_apart_never_both_act_nor_exceed_the_budget(kube, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:6]
    nodes = [kube.create_node(f"gpu-{tag}-{i}", labels={"fleet": tag}) for i in range(NODES)]
    agent = SlowAgent(kube, nodes)
    for n in nodes:
        agent.agent.publish(n, FATAL)
    lease_ns = kube.namespace("lease")
    cfg = config(tmp_path, tag=tag, lease_ns=lease_ns)
    users = {"a": AUDITED[0], "b": AUDITED[1]}
    env = {i: {"KUBECONFIG": str(kube.audited_kubeconfig(u))} for i, u in users.items()}
    from kubernetes import client

    coord = client.CoordinationV1Api(kube.api_client())

    def holder() -> str | None:
        try:
            return coord.read_namespaced_lease("gpuvigil-controller", lease_ns).spec.holder_identity
        except Exception:
            return None

    def acted(who: str) -> bool:
        return any(
            ev["verb"] in WRITES and (ev.get("objectRef") or {}).get("resource") != "leases"
            for ev in kube.audit_events((users[who],))
        )

    agent.start()
    a = start("a", cfg, tmp_path, env=env["a"], skewed=False)
    try:
        wait_for(lambda: holder() == "a", 60, "a to lead")
        b = start("b", cfg, tmp_path, env=env["b"], skewed=True)
        try:
            run_disruptions(a, b, holder=holder, lease_s=6, acted=acted)
            agent.rebreak.clear()

            def all_repaired() -> bool:
                recs = [
                    decode_record(
                        (kube.core().read_node(n).metadata.annotations or {}).get(STATE_ANNOTATION)
                    )
                    for n in nodes
                ]
                return all(r is not None and r.state is State.HEALTHY for r in recs)

            wait_for(all_repaired, 300, "every node repaired, two at a time")
        finally:
            b.stop()
    finally:
        a.stop()
        agent.stop.set()
    check_audit(kube.audit_events(tuple(users.values())), users, nodes)


def check_audit(events: list[dict[str, Any]], users: dict[str, str], nodes: list[str]) -> None:
    ident = {u: i for i, u in users.items()}
    ours = set(nodes)

    def at(ev: dict[str, Any], key: str) -> float:
        t = decode_time(ev[key])
        assert t is not None
        return t.timestamp()

    # the Lease's holders by the API server's clock: successful writes, in commit order
    holders: list[tuple[float, str]] = []
    skews: list[float] = []
    writes: list[dict[str, Any]] = []
    for ev in events:
        ref, code = ev.get("objectRef") or {}, (ev.get("responseStatus") or {}).get("code", 0)
        if ev["verb"] not in WRITES:
            continue
        if ref.get("resource") == "leases":
            if 200 <= code < 300:
                spec = (ev.get("requestObject") or {}).get("spec") or {}
                holders.append((at(ev, "stageTimestamp"), spec.get("holderIdentity") or ""))
                renew = decode_time(spec.get("renewTime"))
                if renew and ident[ev["user"]["username"]] == "b":
                    skews.append(renew.timestamp() - at(ev, "stageTimestamp"))
            continue
        if ref.get("resource") == "nodes" and ref.get("name") not in ours:
            continue
        writes.append(ev)
    holders.sort()
    assert skews and min(skews) > 15, f"b's clock was not ahead: {skews[:3]}"
    assert {h for _, h in holders} >= {"a", "b"}, "no handover happened"
    assert len(writes) > 20, "too few writes to judge"

    def holder_at(t: float) -> str:
        current = ""
        for ts, h in holders:
            if ts > t:
                break
            current = h
        return current

    wrong = [
        (ident[ev["user"]["username"]], ev["verb"], ev["objectRef"], ev["requestReceivedTimestamp"])
        for ev in writes
        if holder_at(at(ev, "requestReceivedTimestamp")) != ident[ev["user"]["username"]]
    ]
    assert not wrong, f"writes by a replica that did not hold the lease: {wrong[:5]}"
    stores = []
    for ev in sorted(writes, key=lambda e: at(e, "stageTimestamp")):
        code = (ev.get("responseStatus") or {}).get("code", 0)
        ann = ((ev.get("requestObject") or {}).get("metadata") or {}).get("annotations") or {}
        node_write = ev["objectRef"].get("resource") == "nodes" and 200 <= code < 300
        if node_write and STATE_ANNOTATION in ann:
            stores.append((ev["objectRef"]["name"], ann[STATE_ANNOTATION]))
    assert max_in_budget(stores) <= BUDGET
    assert max_in_budget(stores) == BUDGET  # the budget was used, not just respected
