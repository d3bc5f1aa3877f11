"""Helpers and fixtures for the controller's integration tests: a fake agent for nodes
without kubelets, health summaries, polling. Test modules import the fixtures by name.

No conftest.py here on purpose: a second module named `conftest` shadows tests/conftest.py
for every later `from conftest import ...` in the same pytest run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import wire
from gpuvigil.core.findings import Action, Status, utcnow
from gpuvigil.core.wire import FindingSummary, HealthSummary

FATAL = FindingSummary(
    code="XID_79",
    component="gpu:3",
    status=Status.FAILED,
    action=Action.RESET_GPU,
    fatal=True,
    check="xid",
)
# a dropped binary: the check fails closed (what a tool breakage looks like on every node)
CANNOT_RUN = FindingSummary(
    code="DEPENDENCY_MISSING",
    component="node",
    status=Status.FAILED,
    action=Action.NONE,
    check="nvml",
)


_AGENT_KEYS: dict[str, Any] = {}


def agent_key(node: str) -> Any:
    """The fake agent's own key for `node` (the real one keeps it in its state dir)."""
    from gpuvigil.core.signing import Signer

    return _AGENT_KEYS.setdefault(node, Signer.generate())


def signed_result(node: str, result: dict[str, Any]) -> dict[str, str]:
    """The result annotations as the real agent writes them: signed with its key, which
    it publishes (`node.sinks.kubernetes`); the controller believes only those."""
    from gpuvigil.core.signing import sig_annotation

    key, text = agent_key(node), json.dumps(result)
    return {
        wire.RESULT_ANNOTATION: text,
        sig_annotation(wire.RESULT_ANNOTATION): key.sign(wire.RESULT_PURPOSE, node, text),
        wire.AGENT_KEY_ANNOTATION: key.public_b64(),
    }


def health(*findings: FindingSummary, age_s: float = 0) -> str:
    status = Status.worst(f.status for f in findings)
    return HealthSummary(
        generated_at=utcnow() - timedelta(seconds=age_s), status=status, findings=list(findings)
    ).model_dump_json()


class Agent:
    """Plays the node agent and preflight for nodes without kubelets: publishes the health
    summary, answers remediation requests, writes preflight results."""

    def __init__(self, core: Any, kube: Any = None) -> None:
        self.core, self.kube = core, kube
        self.answered: list[tuple[str, str]] = []

    def publish(self, node: str, *findings: FindingSummary) -> None:
        ann = {
            wire.HEALTH_ANNOTATION: health(*findings),
            wire.AGENT_KEY_ANNOTATION: agent_key(node).public_b64(),
        }
        self.core.patch_node(node, {"metadata": {"annotations": ann}})

    def step(self, node: str, *, fixes: bool = True, boot_id: str | None = None) -> None:
        """Answer a pending request (once per id), then publish health; preflight when
        VALIDATING."""
        n = self.core.read_node(node)
        ann = n.metadata.annotations or {}
        req = json.loads(ann.get(wire.REQUEST_ANNOTATION, "null") or "null")
        res = json.loads(ann.get(wire.RESULT_ANNOTATION, "null") or "null")
        if req and (not res or res.get("id") != req["id"]):
            self.answered.append((req["id"], req["action"]))
            result = {
                "id": req["id"],
                "result": "succeeded",
                "at": utcnow().isoformat(),
                "detail": req["action"],
            }
            self.core.patch_node(node, {"metadata": {"annotations": signed_result(node, result)}})
            if req["action"] == "REBOOT":
                self.core.patch_node_status(
                    node,
                    {"status": {"nodeInfo": {"bootID": boot_id or f"boot-{len(self.answered)}"}}},
                )
            if fixes:
                self.publish(node)
        state = json.loads(ann.get("gpuvigil.io/state", "null") or "null")
        if state and state.get("state") == "VALIDATING" and self.kube is not None:
            preflight_passes(self.kube, node)


def preflight_passes(
    kube: Any, node: str, *, ns: str = "gpuvigil", exit_code: int = 0, summary: str = "ok"
) -> list[str]:
    """Play the node's kubelet for the preflight pods the controller started on `node`."""
    from gpuvigil.platform.clusters.k8s_preflight import label_value

    verdict = {"result": "pass" if exit_code == 0 else "fail", "summary": summary}
    return kube.run_pods(
        ns,
        selector=f"app.kubernetes.io/name=gpuvigil-preflight,gpuvigil.io/node={label_value(node)}",
        node=node,
        exit_code=exit_code,
        message=json.dumps(verdict),
    )


def wait_for(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def finding_investigate() -> FindingSummary:
    return FindingSummary(
        code="GPU_SDC",
        component="gpu:1",
        status=Status.FAILED,
        action=Action.INVESTIGATE,
        check="matmul",
    )


SRC = Path(__file__).resolve().parents[3] / "src"


def controller_argv(*args: str) -> list[str]:
    """This checkout's gpuvigil (tests/conftest.py's helpers are shadowed by ours here)."""
    return [sys.executable, "-m", "gpuvigil", *args]


def controller_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def stop(proc: subprocess.Popen[str], timeout: float = 15) -> None:
    """SIGTERM a controller process, SIGKILL it if it has not exited in `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def agent(kube: Any) -> Agent:
    kube.ensure_preflight_template()  # the controller's preflight runs come from it
    return Agent(kube.core(), kube)


@pytest.fixture
def kube_cluster(kube: Any) -> Iterator[Callable[..., Any]]:
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings

    made: list[KubernetesCluster] = []

    def make(**kw: Any) -> KubernetesCluster:
        kw.setdefault("eviction_grace_s", 0)
        # each test's own Lease (its budget ledger): tests share one API server
        kw.setdefault("lease_namespace", kube.namespace("lease"))
        # A LIST each pass: these tests change a node and reconcile at once, and a watch's
        # picture lags by milliseconds (test_watch.py tests the watch itself)
        kw.setdefault("watch", False)
        # the count preflight validates is the pool's, as an operator states it (the
        # test nodes are 8-GPU machines in pool "default" unless a test says otherwise)
        kw.setdefault("pool_gpus", {"default": 8})
        c = KubernetesCluster(KubernetesSettings(**kw), api_client=kube.api_client())
        made.append(c)
        return c

    yield make
    for c in made:  # their node watches hold a connection each
        c.close()
