"""The Kubernetes sink against a real kube-apiserver (1.20.2 + etcd on loopback): node
conditions with correct heartbeat/transition times, foreign conditions untouched, the
health annotation, Events on transitions, remediation requests answered once, stale and
stopped agents; and the shipped manifests: server-side dry run and the agent's RBAC."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import agent_helpers
import pytest
import yaml
from agent_helpers import wait_until

from gpuvigil.core import codes, wire

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
REPO = Path(__file__).resolve().parents[3]
XID79 = (
    "[ 1500.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)
SA = "system:serviceaccount:gpuvigil:gpuvigil-agent"


def conds(kube, node: str) -> dict[str, dict]:
    n = kube.core().read_node(node)
    return {c.type: c.to_dict() for c in n.status.conditions or []}


def k8s_agent(start_agent, kube, node: str, tmp_path: Path, fake_bin, **kw):
    resets = tmp_path / "resets.log"
    fake_bin("nvidia-smi", f'#!/bin/sh\necho "$@" >> {resets}\n')
    signer, pub = agent_helpers.controller_key(tmp_path)
    a = agent_helpers.start_kube_agent(
        start_agent, node, kubeconfig=kube.kubeconfig, trust=pub,
        remediation={"boot_id_path": str(tmp_path / "boot_id")}, **kw,
    )  # fmt: skip
    a.extra["resets"] = resets
    a.extra["signer"] = signer
    return a


def test_conditions_annotation_events_and_remediation(start_agent, kube, tmp_path, fake_bin):
    node = kube.create_node()
    a = k8s_agent(start_agent, kube, node, tmp_path, fake_bin)
    wait_until(lambda: set(codes.FAMILIES) <= set(conds(kube, node)), 15, "our conditions")
    c0 = conds(kube, node)
    assert c0["Ready"]["reason"] == "KubeletReady"  # not ours: untouched
    assert all(c0[f]["status"] == "False" for f in codes.FAMILIES)
    hb0 = c0["GPUThermal"]["last_heartbeat_time"]
    tt0 = c0["GPUThermal"]["last_transition_time"]
    summary = wire.decode_health(
        kube.core().read_node(node).metadata.annotations.get(wire.HEALTH_ANNOTATION)
    )
    assert summary is not None and summary.status.value == "OK"

    # An Xid: the condition turns on within 2 s (+ slack), with an Event.
    time.sleep(1.1)  # condition times have one-second resolution
    t0 = time.monotonic()
    a.machine.log(XID79)
    wait_until(lambda: conds(kube, node)["GPUXidError"]["status"] == "True", 4.5, "GPUXidError")
    assert time.monotonic() - t0 < 4.5
    c1 = conds(kube, node)
    assert c1["GPUXidError"]["reason"] == "XID_79"
    assert c1["GPUXidError"]["last_transition_time"] > c0["GPUXidError"]["last_transition_time"]
    wait_until(
        lambda: conds(kube, node)["GPUThermal"]["last_heartbeat_time"] > hb0, 5, "a newer heartbeat"
    )
    assert conds(kube, node)["GPUThermal"]["last_transition_time"] == tt0  # no flip: kept
    events = (
        kube.core()
        .list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
        .items
    )
    xid_events = [e for e in events if e.reason == "XID_79"]
    assert xid_events and xid_events[0].type == "Warning"
    assert xid_events[0].source.component == "gpuvigil-agent"
    summary = wire.decode_health(
        kube.core().read_node(node).metadata.annotations.get(wire.HEALTH_ANNOTATION)
    )
    assert summary.status.value == "FAILED"
    assert any(f.code == "XID_79" and f.fatal for f in summary.findings)

    # The controller asks for a GPU reset: run once, answered once, idempotent by id.
    req = {"id": "req-1", "action": "RESET_GPU", "gpus": [0]}
    kube.core().patch_node(
        node,
        {"metadata": {"annotations": agent_helpers.signed_request(a.extra["signer"], node, req)}},
    )

    def result() -> dict | None:
        ann = kube.core().read_node(node).metadata.annotations or {}
        raw = ann.get(wire.RESULT_ANNOTATION)
        return json.loads(raw) if raw else None

    done = wait_until(
        lambda: (r := result()) and r["result"] == "succeeded" and r, 10, "remediation result"
    )
    assert done["id"] == "req-1"
    time.sleep(2.5)  # several more publishes: nothing is run again
    assert a.extra["resets"].read_text().splitlines() == ["--gpu-reset -i 0"]
    assert (
        'gpuvigil_agent_remediations_total{action="RESET_GPU",result="succeeded"} 1.0'
        in a.metrics()
    )

    # A graceful stop says so on the conditions.
    assert a.stop(signal.SIGTERM) == 0
    stopped = conds(kube, node)
    assert {stopped[f]["status"] for f in codes.FAMILIES} == {"Unknown"}
    assert stopped["GPUXidError"]["reason"] == "AgentStopped"
    assert "XID_79" in stopped["GPUXidError"]["message"]


def test_killed_agent_leaves_a_heartbeat_that_ages(start_agent, kube, tmp_path, fake_bin):
    node = kube.create_node()
    a = k8s_agent(start_agent, kube, node, tmp_path, fake_bin)
    wait_until(lambda: set(codes.FAMILIES) <= set(conds(kube, node)), 15, "our conditions")
    first = conds(kube, node)["GPUHealthCheckFailing"]["last_heartbeat_time"]
    wait_until(
        lambda: conds(kube, node)["GPUHealthCheckFailing"]["last_heartbeat_time"] > first,
        5,
        "a second heartbeat",
    )
    a.stop(signal.SIGKILL)
    last = conds(kube, node)["GPUHealthCheckFailing"]["last_heartbeat_time"]
    time.sleep(3.0)  # three heartbeat intervals
    assert conds(kube, node)["GPUHealthCheckFailing"]["last_heartbeat_time"] == last


@pytest.fixture(scope="module")
def deployed(kube):
    """The shipped manifests with the agent as its ServiceAccount (overlays/service-account;
    the default's agent talks as its node, test_node_identity_kubernetes.py), server-side
    dry run first, then applied for real (the DaemonSet's pods never start: there are no
    kubelets); deleted afterwards."""
    rendered = kube.kustomize(REPO / "deploy/kubernetes/overlays/service-account")
    ns = kube.kubectl("apply", "-f", str(REPO / "deploy/kubernetes/namespace/namespace.yaml"))
    assert ns.returncode == 0, ns.stderr
    dry = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    assert dry.returncode == 0, dry.stderr
    real = kube.kubectl("apply", "-f", "-", input=rendered)
    assert real.returncode == 0, real.stderr
    yield dry.stdout
    # Everything but the namespace: with no namespace controller running, a deleted
    # namespace stays Terminating, and later tests in this session deploy into it.
    keep = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") != "Namespace"]
    kube.kubectl("delete", "-f", "-", "--wait=false", input=yaml.safe_dump_all(keep))


def test_manifests_pass_server_dry_run_and_rbac_is_minimal(kube, deployed):
    # "unchanged" when another module of this session applied the manifests first
    assert re.search(
        r"daemonset.apps/gpuvigil-agent (created|unchanged|configured) "
        r"\(server dry run\)",
        deployed,
    ), deployed

    def can(*args: str) -> str:
        return kube.kubectl("auth", "can-i", *args, "--as", SA).stdout.strip()

    assert can("patch", "nodes", "--subresource=status") == "yes"
    assert can("get", "nodes") == "yes"
    assert can("patch", "nodes") == "no"  # never a taint or a cordon: status only
    assert can("create", "events", "-n", "default") == "yes"
    assert can("delete", "nodes") == "no"
    assert can("get", "secrets", "-n", "gpuvigil") == "no"
    assert can("list", "secrets", "--all-namespaces") == "no"
    assert can("create", "pods/eviction", "-n", "default") == "no"
    assert can("update", "nodes") == "no"


def test_the_agent_needs_nothing_beyond_its_rbac(start_agent, kube, deployed, tmp_path, fake_bin):
    """The agent authenticated as its own ServiceAccount (a TokenRequest token) publishes
    conditions, the annotation and Events, and answers a remediation request."""
    cfg = agent_helpers.sa_kubeconfig(kube, tmp_path / "sa.kubeconfig", sa="gpuvigil-agent")
    signer, pub = agent_helpers.controller_key(tmp_path)
    node = kube.create_node()
    resets = tmp_path / "resets.log"
    fake_bin("nvidia-smi", f'#!/bin/sh\necho "$@" >> {resets}\n')
    a = agent_helpers.start_kube_agent(
        start_agent, node, kubeconfig=cfg, trust=pub, sinks=("state-file",),
        remediation={"boot_id_path": str(tmp_path / "boot_id")},
    )  # fmt: skip
    wait_until(lambda: set(codes.FAMILIES) <= set(conds(kube, node)), 15, "our conditions")
    a.machine.log(XID79)
    wait_until(lambda: conds(kube, node)["GPUXidError"]["status"] == "True", 5, "GPUXidError")
    wait_until(
        lambda: any(
            e.reason == "XID_79"
            for e in kube.core()
            .list_namespaced_event("default", field_selector=f"involvedObject.name={node}")
            .items
        ),
        5,
        "the Event",
    )
    kube.core().patch_node(
        node,
        {
            "metadata": {
                "annotations": agent_helpers.signed_request(
                    signer, node, {"id": "sa-1", "action": "RESET_GPU", "gpus": [2]}
                )
            }
        },
    )
    wait_until(
        lambda: (
            '"succeeded"'
            in (kube.core().read_node(node).metadata.annotations or {}).get(
                wire.RESULT_ANNOTATION, ""
            )
        ),
        10,
        "the remediation result",
    )
    assert "forbidden" not in a.log().lower(), a.log()
