"""Liveness that means something, on a real kube-apiserver (issue #13 item 5): an agent
whose NODE_NAME names no Node fails every Kubernetes publish; once that has lasted
`agent.sink_failure_grace_s`, /healthz answers 503 naming the sink, so the kubelet
restarts it and the mistake shows as CrashLoopBackOff instead of a verdict nobody reads."""

from __future__ import annotations

import json

import agent_helpers
import pytest
from agent_helpers import http_get, wait_until

start_agent = agent_helpers.start_agent  # the fixture
pytestmark = pytest.mark.realparts


def test_a_mistyped_node_name_trips_liveness(start_agent, kube) -> None:
    cfg = {"agent": {"sink_failure_grace_s": 2.0}}
    argv = ["--interval", "1", "--node-name", "gpu-tpyo-does-not-exist", "--sink",
            "kubernetes", "--sink", "http", "--sink", "state-file", "--kubeconfig",
            str(kube.kubeconfig)]  # fmt: skip
    a = start_agent(cfg, *argv, wait_ready=False)
    # The kubernetes client alone takes seconds of CPU to import on a loaded machine.
    wait_until(a.state_file.exists, 90, "the agent's first report")

    def unhealthy() -> dict | None:
        code, body = http_get(a.url + "/healthz")
        return json.loads(body) if code == 503 else None

    body = wait_until(unhealthy, 60, "/healthz to fail", every=0.2)
    assert body["sinks_failing_s"]["kubernetes"] >= 2.0
    assert (
        "not found" in body["sinks"]["kubernetes"].lower() or "404" in body["sinks"]["kubernetes"]
    )
    assert "state_file" not in body["sinks_failing_s"]  # the sinks that work are not blamed
