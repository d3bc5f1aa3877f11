"""What the agent believes about the controller's requests, tried with a real agent process
against the real kube-apiserver 1.20.2: a rotated or deleted controller key stops verifying
at once; a result planted on the Node neither stops a reset nor fools the controller nor
fakes a reboot; a request replayed after the ledger is lost never runs again
(docs/security.md)."""

from __future__ import annotations

import time
from pathlib import Path

import agent_helpers
import pytest
from agent_helpers import wait_until

from gpuvigil.core import wire
from gpuvigil.core.findings import Action, utcnow
from gpuvigil.core.signing import Signer, sig_annotation

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


def plant(kube, node: str, **result: str) -> dict[str, str]:
    """What someone else who can write the Node writes: a result of their own making,
    signed with their own key, which they also publish as the agent's."""
    fake = Signer.generate()
    text = wire.encode_result(wire.RemediationResult(at=utcnow(), **result))
    return {
        wire.RESULT_ANNOTATION: text,
        sig_annotation(wire.RESULT_ANNOTATION): fake.sign(wire.RESULT_PURPOSE, node, text),
        wire.AGENT_KEY_ANNOTATION: fake.public_b64(),
    }


def test_a_planted_result_neither_stops_the_agent_nor_fools_the_controller(
    start_agent, kube, tmp_path, fake_bin
):
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings

    node, _a, signer, _, resets = agent(start_agent, kube, tmp_path, fake_bin)
    fake_bin("nvidia-smi", f'#!/bin/sh\nsleep 1.5\necho "$@" >> {resets}\n')
    # A forged `succeeded` under the request's own id, written with the request: the
    # agent's ledger, not the Node, says whether it ran, so the reset still runs.
    rid = "planted-before"
    ann = agent_helpers.signed_request(signer, node, {"id": rid, "action": "RESET_GPU",
                                                      "gpus": [4]})  # fmt: skip
    ann.update(plant(kube, node, id=rid, action="RESET_GPU", result="succeeded"))
    kube.core().patch_node(node, {"metadata": {"annotations": ann}})
    wait_until(lambda: resets.read_text().splitlines() == ["--gpu-reset -i 4"], 10, "the reset")

    # The controller: pins the agent's key when it first writes to the node, and believes
    # only a result signed with it.
    kube.ensure_namespace("gpuvigil")
    c = KubernetesCluster(
        KubernetesSettings(watch=False, signing_key_file=str(tmp_path / "ctl.key")),
        api_client=kube.api_client(),
    )
    (tmp_path / "ctl.key").write_bytes(signer.private_pem())
    c.request(node, action=Action.RESET_GPU, request_id="L2", gpus=[5])
    wire_id = wire.decode_request(
        kube.core().read_node(node).metadata.annotations[wire.REQUEST_ANNOTATION]
    )[0].id
    assert wire_id.startswith("L2.") and len(wire_id) == len("L2.") + 22  # unguessable
    wait_until(lambda: (r := result(kube, node)) and r.id == wire_id, 10, "started")
    forged = plant(kube, node, id=wire_id, action="RESET_GPU", result="succeeded")
    kube.core().patch_node(node, {"metadata": {"annotations": forged}})
    assert c.get_node(node).agent_result is None  # not signed by the pinned key
    got = wait_until(lambda: c.get_node(node).agent_result, 10, "the agent's own answer")
    assert got.request_id == "L2" and got.succeeded
    assert resets.read_text().splitlines() == ["--gpu-reset -i 4", "--gpu-reset -i 5"]
    c.close()


def test_a_planted_started_does_not_make_a_reboot_that_never_happened(
    start_agent, kube, tmp_path, fake_bin
):
    node, _a, signer, _, _ = agent(start_agent, kube, tmp_path, fake_bin)
    (tmp_path / "boot_id").write_text("boot-now\n")
    reboots = tmp_path / "reboots.log"
    fake_bin("systemctl", f'#!/bin/sh\necho "$@" >> {reboots}\n')
    ann = agent_helpers.signed_request(signer, node, {"id": "b1", "action": "REBOOT"})
    # "started in another boot": believed, it would read as a reboot done.
    ann.update(plant(kube, node, id="b1", action="REBOOT", result="started", boot_id="boot-0"))
    kube.core().patch_node(node, {"metadata": {"annotations": ann}})
    wait_until(reboots.exists, 10, "the reboot command")
    time.sleep(1.0)  # several more polls
    got = result(kube, node)
    assert got.result == "started" and got.boot_id == "boot-now"  # its own, not succeeded
    assert reboots.read_text().splitlines() == ["reboot"]


def test_a_lost_ledger_never_runs_a_request_again(start_agent, kube, tmp_path, fake_bin):
    node, a, signer, pub, resets = agent(start_agent, kube, tmp_path, fake_bin)
    ask(kube, node, signer, "once", 6)
    wait_until(lambda: (r := result(kube, node)) and r.final, 10, "the answer")
    a.stop()
    # The same request is still on the Node (and within its hour); the result is erased
    # and the agent comes back without its ledger (a new state dir).
    kube.core().patch_node(node, {"metadata": {"annotations": {wire.RESULT_ANNOTATION: None}}})
    again = agent_helpers.start_kube_agent(
        start_agent, node, kubeconfig=kube.kubeconfig, trust=pub, poll_s=0.3,
        remediation={"boot_id_path": str(tmp_path / "boot_id")},
    )  # fmt: skip
    wait_until(lambda: rejected(again, "older than the ledger") >= 1, 10, "the replay refused")
    time.sleep(1.0)
    assert resets.read_text().splitlines() == ["--gpu-reset -i 6"]
    assert result(kube, node) is None


def test_pins_that_cannot_be_read_believe_no_result_and_break_no_read(kube, tmp_path):
    """A reader of the cluster that may not read the trust ConfigMap (a person's
    `gpuvigil nodes`, a broken RBAC) sees nodes as usual and believes no result."""
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings

    user = "nodes-and-pods-only"
    for argv in (
        ["create", "clusterrole", user, "--verb=get,list", "--resource=nodes,pods"],
        ["create", "clusterrolebinding", user, f"--clusterrole={user}", f"--user={user}"],
    ):
        done = kube.kubectl(*argv)
        assert done.returncode == 0 or "AlreadyExists" in done.stderr, done.stderr
    node = kube.create_node()
    genuine = Signer.generate()  # as if pinned: the reader cannot tell either way
    text = wire.encode_result(
        wire.RemediationResult(id="x", action="REBOOT", result="succeeded", at=utcnow())
    )
    ann = {
        wire.RESULT_ANNOTATION: text,
        sig_annotation(wire.RESULT_ANNOTATION): genuine.sign(wire.RESULT_PURPOSE, node, text),
        wire.AGENT_KEY_ANNOTATION: genuine.public_b64(),
    }
    kube.core().patch_node(node, {"metadata": {"annotations": ann}})
    api = kube.api_client()
    api.set_default_header("Impersonate-User", user)
    c = KubernetesCluster(KubernetesSettings(watch=False), api_client=api)
    view = c.get_node(node)
    assert view.name == node and view.agent_result is None
    c.close()
