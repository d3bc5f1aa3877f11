"""`gpuvigil release NODE` on a real kube-apiserver writes `gpuvigil.io/released-at`; the
running agent (Kubernetes sink) reads it with its Node and forgets the INVESTIGATE Xid it
kept for a person."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta

import agent_helpers
import pytest
import yaml
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.core.findings import utcnow
from testkit import cli_env, gpuvigil_argv

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts


def test_release_reaches_the_agent(start_agent, kube, tmp_path, fake_bin):
    node = kube.create_node()
    kube.ensure_namespace("gpuvigil")  # where `release` keeps the controller's signing key
    state = tmp_path / "state"
    trusted = tmp_path / "trust" / "controller.pub"  # as the DaemonSet mounts the ConfigMap
    a = agent_helpers.start_kube_agent(
        start_agent, node, kubeconfig=kube.kubeconfig, trust=trusted, sinks=("state-file",),
        agent={"state_dir": str(state)},
    )  # fmt: skip
    at = utcnow() - timedelta(minutes=1)
    a.machine.log(
        f"{at.isoformat().replace('.', ',')} NVRM: Xid (PCI:0000:18:00): 54, "
        "pid=1, name=python3, Auxiliary power is not connected to the GPU board"
    )
    # 30 s: the agent's first sweeps on a loaded 2-core CI machine (10 s timed out once)
    wait_until(lambda: ("kernel_log", "XID_54") in a.codes(), 30, "XID_54")
    assert json.loads((state / "xid-events.json").read_text())["events"]

    cfg = tmp_path / "controller.yaml"
    cfg.write_text(
        yaml.safe_dump({"controller": {"kubernetes": {"kubeconfig": str(kube.kubeconfig)}}})
    )
    out = subprocess.run(
        gpuvigil_argv(
            "release",
            node,
            "--force",
            "--by",
            "alice",
            "--cluster",
            "kubernetes",
            "--config",
            str(cfg),
        ),
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    ann = kube.core().read_node(node).metadata.annotations or {}
    released = wire.decode_time(ann.get(wire.RELEASED_ANNOTATION))
    assert released is not None and released > at
    # The release is signed; the agent believes it once it has the controller's public key
    # (the ConfigMap the controller published, which kubelet would mount).
    cm = kube.core().read_namespaced_config_map("gpuvigil-trust", "gpuvigil")
    trusted.parent.mkdir()
    trusted.write_text(cm.data["controller.pub"])

    wait_until(lambda: ("kernel_log", "XID_54") not in a.codes(), 30, "XID_54 released")
    assert json.loads((state / "xid-events.json").read_text())["events"] == []
