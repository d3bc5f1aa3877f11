# ruff: noqa: F811  (fixtures imported from ctl_helpers are parameters here)
"""`gpuvigil controller`, `nodes` and `release` as processes against the real kube-apiserver:
a controller killed mid-drain resumes without repeating a step; two replicas, one leader,
and the standby takes over when the leader dies."""

from __future__ import annotations

import json
import signal
import subprocess
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
    wait_for,
)

from gpuvigil.core import wire
from gpuvigil.platform.state import State, decode_record

pytestmark = pytest.mark.realparts


def write_config(tmp_path: Path, selector: str, **extra: Any) -> Path:
    lines = [
        "controller:",
        "  cluster: kubernetes",
        "  interval_s: 0.5",
        "  metrics_port: 0",
        f"  leader_election: {str(extra.pop('leader', False)).lower()}",
        "  policy: {drain_timeout_s: 3600, fatal_grace_s: 0}",
        "  safety: {max_disrupted: 5, max_disrupted_percent: 100}",
        "  kubernetes:",
        f"    node_selector: '{selector}'",
        "    eviction_grace_s: 0",
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


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_killed_mid_drain_resumes_without_repeating(kube, agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    kube.start_disruption_controller()
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    ns = kube.namespace()
    kube.create_running_pod(node, namespace=ns, name="guarded", labels={"app": tag})
    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=f"""
apiVersion: policy/v1beta1
kind: PodDisruptionBudget
metadata: {{name: pdb, namespace: {ns}}}
spec: {{minAvailable: 1, selector: {{matchLabels: {{app: "{tag}"}}}}}}
""",
    )
    wait_for(
        lambda: (
            kube.kubectl(
                "get", "pdb", "pdb", "-n", ns, "-o", "jsonpath={.status.expectedPods}"
            ).stdout
            == "1"
        ),
        30,
        "pdb",
    )
    agent.publish(node, FATAL)
    cfg = write_config(tmp_path, f"fleet={tag}")
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
    assert json.loads(ann[wire.REQUEST_ANNOTATION])["id"] == rec.request_id


def test_two_replicas_one_leader_and_takeover(kube, agent, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    agent.publish(node)
    ns = kube.namespace("lease")
    cfg = write_config(
        tmp_path,
        f"fleet={tag}",
        leader=True,
        lease_namespace=ns,
        lease_duration_s=3,
        lease_renew_s=1,
    )
    a, _ = start(kube, cfg, tmp_path, "a")
    b, _ = start(kube, cfg, tmp_path, "b")
    coord = None
    try:
        from kubernetes import client

        coord = client.CoordinationV1Api(kube.api_client())
        wait_for(lambda: _holder(coord, ns) in ("a", "b"), 30, "a leader")
        leader = _holder(coord, ns)
        time.sleep(2)
        assert _holder(coord, ns) == leader  # stable: the other stays standby
        lead_proc, other = (a, "b") if leader == "a" else (b, "a")
        lead_proc.send_signal(signal.SIGKILL)  # dies without giving the Lease up
        lead_proc.wait()
        died = time.monotonic()
        wait_for(lambda: _holder(coord, ns) == other, 15, "the standby to take over")
        took = time.monotonic() - died
        print(f"standby took over {took:.1f} s after the leader died (lease 3 s)")
        assert took < 3 + 3, f"took over after {took:.1f} s"
        agent.publish(node, FATAL)  # the new leader acts
        wait_for(
            lambda: (r := record(kube, node)) is not None and r.state is not State.HEALTHY,
            15,
            "the new leader to act",
        )
    finally:
        stop(a)
        stop(b)


def _holder(coord: Any, ns: str) -> str | None:
    try:
        return coord.read_namespaced_lease("gpuvigil-controller", ns).spec.holder_identity
    except Exception:
        return None


def test_nodes_and_release(kube, agent, tmp_path, run_cli) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex[:6]
    node = kube.create_node(f"gpu-{tag}", labels={"fleet": tag})
    agent.publish(node, finding_investigate())
    cfg = write_config(tmp_path, f"fleet={tag}")
    dry = run_cli("controller", "--config", str(cfg), "--once", "--dry-run", env=kube.env())
    assert dry.returncode == 0, dry.stderr
    assert f"{node}\tQUARANTINED" in dry.stdout and record(kube, node) is None  # never acted
    done = run_cli("controller", "--config", str(cfg), "--once", env=kube.env())
    assert done.returncode == 0, done.stderr
    assert record(kube, node).state is State.QUARANTINED
    listed = run_cli("nodes", "--config", str(cfg), "--json", env=kube.env())
    (row,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["state"] == "QUARANTINED" and "GPU_SDC" in row["reason"]
    assert row["blocked_by"] == ["gpuvigil"]
    released = run_cli("release", node, "--config", str(cfg), env=kube.env())
    assert released.returncode == 0, released.stderr
    rec = record(kube, node)
    assert rec.state is State.VALIDATING and "released by" in rec.reason
    again = run_cli("release", node, "--config", str(cfg), env=kube.env())
    assert again.returncode == 1 and "not QUARANTINED" in again.stderr
    detail = run_cli("nodes", node, "--config", str(cfg), env=kube.env())
    assert "-> QUARANTINED" in detail.stdout and "-> VALIDATING" in detail.stdout
