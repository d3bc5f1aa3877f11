"""What the agent believes about the controller's requests, tried with a real agent process
against the real kube-apiserver 1.20.2: a rotated or deleted controller key stops verifying
at once (docs/security.md, "Keys")."""

from __future__ import annotations

import time
from pathlib import Path

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.core.signing import Signer

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts
REJECTED = 'gpuvigil_agent_rejected_messages_total{kind="remediation-request",reason="%s"}'


def agent(start_agent, kube, tmp_path: Path, fake_bin):
    """A real agent on a new node; GPU resets are logged to `resets`."""
    node = kube.create_node()
    resets = tmp_path / "resets.log"
    resets.touch()
    fake_bin("nvidia-smi", f'#!/bin/sh\necho "$@" >> {resets}\n')
    signer, pub = agent_helpers.controller_key(tmp_path)
    a = agent_helpers.start_kube_agent(
        start_agent, node, kubeconfig=kube.kubeconfig, trust=pub, poll_s=0.3,
        remediation={"boot_id_path": str(tmp_path / "boot_id")},
    )  # fmt: skip
    return node, a, signer, pub, resets


def ask(kube, node: str, signer: Signer, rid: str, gpu: int) -> None:
    req = {"id": rid, "action": "RESET_GPU", "gpus": [gpu]}
    ann = agent_helpers.signed_request(signer, node, req)
    kube.core().patch_node(node, {"metadata": {"annotations": ann}})


def result(kube, node: str) -> wire.RemediationResult | None:
    ann = kube.core().read_node(node).metadata.annotations or {}
    return wire.decode_result(ann.get(wire.RESULT_ANNOTATION))[0]


def rejected(a, reason: str) -> float:
    for line in a.metrics().splitlines():
        if line.startswith(REJECTED % reason):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_rotated_or_deleted_key_stops_verifying_at_once(start_agent, kube, tmp_path, fake_bin):
    node, a, old, pub, resets = agent(start_agent, kube, tmp_path, fake_bin)
    ask(kube, node, old, "r-old-ok", 0)
    wait_until(lambda: (r := result(kube, node)) and r.final and r.id == "r-old-ok", 10, "r1")
    # Rotation: the ConfigMap (the mounted file) holds only the new key. A request signed
    # with the old one is never run, though the agent saw nothing signed with the new key.
    new = Signer.generate()
    pub.write_bytes(new.public_pem())
    ask(kube, node, old, "r-old-after-rotation", 1)
    wait_until(lambda: rejected(a, "unknown key") >= 1, 10, "the old key refused")
    ask(kube, node, new, "r-new", 2)
    wait_until(lambda: (r := result(kube, node)) and r.final and r.id == "r-new", 10, "r-new")
    # A key deleted while the agent runs (no cache keeps it alive).
    pub.write_bytes(old.public_pem())  # revoke the new key, trust the old one again
    ask(kube, node, new, "r-new-after-delete", 3)
    wait_until(lambda: rejected(a, "unknown key") >= 2, 10, "the deleted key refused")
    time.sleep(1.0)  # several more polls: still nothing run
    assert resets.read_text().splitlines() == ["--gpu-reset -i 0", "--gpu-reset -i 2"]
    assert result(kube, node).id == "r-new"
