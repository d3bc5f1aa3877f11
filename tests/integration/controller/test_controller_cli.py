# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""`gpuvigil controller`, `nodes` and `release` as processes against the real kube-apiserver:
a controller killed mid-drain resumes without repeating a step; two replicas, one leader,
and the standby takes over when the leader dies."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import (  # noqa: F401  (fixtures)
    FATAL,
    agent,
    controller_argv,
    controller_env,
    finding_investigate,
    kube_cluster,
    stop,
    wait_for,
)

from gpuvigil.core import wire
from gpuvigil.platform.state import State, decode_record

pytestmark = pytest.mark.realparts


def write_config(tmp_path: Path, selector: str, *, kube: Any, **extra: Any) -> Path:
    extra.setdefault("lease_namespace", kube.namespace("lease"))  # each test its own Lease
    lines = [
        "controller:",
        "  cluster: kubernetes",
        "  interval_s: 0.5",
        "  metrics_port: 0",
        f"  leader_election: {str(extra.pop('leader', False)).lower()}",
        f"  lease: {extra.pop('lease', '{}')}",
        "  policy: {drain_timeout_s: 3600, fatal_grace_s: 0}",
        "  safety: {max_disrupted: 5, max_disrupted_percent: 100}",
        "  kubernetes:",
        f"    node_selector: '{selector}'",
        "    eviction_grace_s: 0",
        "    pool_gpus: {default: 8}",
    ]
    lines += [f"    {k}: {v}" for k, v in extra.items()]
    path = tmp_path / f"c-{uuid.uuid4().hex[:4]}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def start(kube: Any, cfg: Path, tmp_path: Path, ident: str) -> tuple[subprocess.Popen[str], Path]:
    log = tmp_path / f"{ident}.log"
    proc = subprocess.Popen(
        controller_argv("controller", "--config", str(cfg), "--identity", ident),
        env=controller_env(kube.env()), stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return proc, log


def record(kube: Any, node: str) -> Any:
    return decode_record(
        (kube.core().read_node(node).metadata.annotations or {}).get("gpuvigil.io/state")
    )


def test_killed_mid_drain_resumes_without_repeating(kube, agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    kube.start_disruption_controller()
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    ns = kube.namespace()
    kube.create_running_pod(node, namespace=ns, name="guarded", labels={"app": tag})
    kube.guard_with_pdb(ns, tag)
    agent.publish(node, FATAL)
    cfg = write_config(tmp_path, f"fleet={tag}", kube=kube)
    proc, _ = start(kube, cfg, tmp_path, "a")
    try:
        wait_for(
            lambda: (r := record(kube, node)) is not None and r.state is State.DRAINING,
            30,
            "DRAINING",
        )
        time.sleep(2)  # a few passes: the PDB refuses (429), the node stays DRAINING
        assert record(kube, node).state is State.DRAINING
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    kube.kubectl("delete", "pdb", "pdb", "-n", ns)
    proc, _ = start(kube, cfg, tmp_path, "b")
    try:
        wait_for(lambda: record(kube, node).state is State.REMEDIATING, 30, "REMEDIATING")
        wait_for(lambda: record(kube, node).issued, 10, "the request confirmed")
    finally:
        stop(proc)
    rec = record(kube, node)
    assert [t.to for t in rec.history] == [State.DRAINING, State.REMEDIATING]  # no repeats
    ann = kube.core().read_node(node).metadata.annotations
    # the id on the wire is the record's, with the controller's unguessable tag after a dot
    sent, _, tag = json.loads(ann[wire.REQUEST_ANNOTATION])["id"].rpartition(".")
    assert sent == rec.request_id and tag


def test_two_replicas_one_leader_and_takeover(kube, agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two replicas, one Lease. Load may slow anything here, so nothing is timed against a
    fixed budget: the safety property is read from the Lease itself. A holder may change
    only by expiry: the new holder's acquireTime is at least `duration_s` after the last
    renewTime anyone saw from the old one (one machine, one wall clock)."""
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    agent.publish(node)
    ns = kube.namespace("lease")
    duration = 4.0
    cfg = write_config(
        tmp_path,
        f"fleet={tag}",
        kube=kube,
        leader=True,
        lease_namespace=ns,
        lease=f"{{duration_s: {duration}, renew_deadline_s: 3, retry_s: 0.5}}",
    )
    from kubernetes import client

    watcher = LeaseWatcher(client.CoordinationV1Api(kube.api_client()), ns)
    a, _ = start(kube, cfg, tmp_path, "a")
    b, _ = start(kube, cfg, tmp_path, "b")
    watcher.start()
    try:
        wait_for(lambda: watcher.holder() in ("a", "b"), 60, "a leader")
        wait_for(lambda: watcher.renewals() >= 3, 60, "the leader to renew")
        leader = watcher.holder()
        lead_proc, other = (a, "b") if leader == "a" else (b, "a")
        lead_proc.send_signal(signal.SIGKILL)  # dies without giving the Lease up
        lead_proc.wait()
        died = time.monotonic()
        wait_for(lambda: watcher.holder() == other, duration + 60, "the standby to take over")
        print(f"standby took over {time.monotonic() - died:.1f} s after the leader died")
        agent.publish(node, FATAL)  # the new leader acts
        wait_for(
            lambda: (r := record(kube, node)) is not None and r.state is not State.HEALTHY,
            60,
            "the new leader to act",
        )
    finally:
        watcher.stop.set()
        stop(a)
        stop(b)
    assert watcher.changes, "the standby never took the Lease"
    for old, new, last_renew, acquired in watcher.changes:
        gap = (acquired - last_renew).total_seconds()
        assert gap >= duration - 0.01, f"{new} took the Lease from {old} after only {gap:.2f} s"


class LeaseWatcher(threading.Thread):
    """Reads the Lease every 50 ms; notes each change of holder with the old holder's last
    renewTime seen and the new holder's acquireTime."""

    def __init__(self, coord: Any, ns: str) -> None:
        super().__init__(daemon=True)
        self.coord, self.ns, self.stop = coord, ns, threading.Event()
        self.last: tuple[str | None, Any] = (None, None)
        self.seen_renewals: set[Any] = set()
        self.changes: list[tuple[str, str, Any, Any]] = []

    def holder(self) -> str | None:
        return self.last[0]

    def renewals(self) -> int:
        return len(self.seen_renewals)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                spec = self.coord.read_namespaced_lease("gpuvigil-controller", self.ns).spec
            except Exception:
                continue  # not created yet, or a slow read: look again
            holder, renewed = spec.holder_identity, spec.renew_time
            old, last_renew = self.last
            if old and holder and holder != old:  # not a release ("" holder)
                self.changes.append((old, holder, last_renew, spec.acquire_time))
            self.seen_renewals.add(renewed)
            self.last = (holder, renewed)


def test_nodes_and_release(kube, agent, tmp_path, run_cli) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    agent.publish(node, finding_investigate())
    cfg = write_config(tmp_path, f"fleet={tag}", kube=kube)
    dry = run_cli("controller", "--config", str(cfg), "--once", "--dry-run", env=kube.env())
    assert dry.returncode == 0, dry.stderr
    assert f"{node}\tQUARANTINED" in dry.stdout and record(kube, node) is None  # never acted
    # gpuvigil nodes shows what the live controller would have done (the dry run's intent)
    would = run_cli("nodes", "--config", str(cfg), "--json", env=kube.env())
    (wrow,) = [json.loads(line) for line in would.stdout.splitlines()]
    assert (wrow["state"], wrow["dry_run"], wrow["stored_state"]) == ("QUARANTINED", True,
                                                                       "HEALTHY")  # fmt: skip
    assert wrow["blocked_by"] == [] and wrow["decision"]["dry_run"] is True
    done = run_cli("controller", "--config", str(cfg), "--once", env=kube.env())
    assert done.returncode == 0, done.stderr
    assert record(kube, node).state is State.QUARANTINED
    listed = run_cli("nodes", "--config", str(cfg), "--json", env=kube.env())
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["state"] == "QUARANTINED" and "GPU_SDC" in row["reason"]
    assert row["blocked_by"] == ["gpuvigil"]
    assert (row["reason"], row["next"]) == (wrow["reason"], wrow["next"])  # as it said
    assert row["dry_run"] is False and row["decision"]["dry_run"] is False
    story = run_cli("explain", node, "--config", str(cfg), "--json", env=kube.env())
    assert story.returncode == 0, story.stderr
    said = [json.loads(line)["what"] for line in story.stdout.splitlines()]
    assert any(w.startswith("-> QUARANTINED: needs a human") for w in said), said
    assert any(w.startswith("decided QUARANTINED") for w in said), said
    released = run_cli("release", node, "--config", str(cfg), env=kube.env())
    assert released.returncode == 0, released.stderr
    rec = record(kube, node)
    assert rec.state is State.VALIDATING and "released by" in rec.reason
    again = run_cli("release", node, "--config", str(cfg), env=kube.env())
    assert again.returncode == 1 and "not QUARANTINED" in again.stderr
    detail = run_cli("nodes", node, "--config", str(cfg), env=kube.env())
    assert "-> QUARANTINED" in detail.stdout and "-> VALIDATING" in detail.stdout
