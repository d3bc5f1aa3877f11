"""A real Prometheus server scrapes a running `gpuvigil agent` on loopback, loads
gpuvigil's alert rules, and answers queries for the agent's metrics over its HTTP API.

The agent runs for real (no GPU here: its GPU checks fail closed, which is what it must
do) with a kernel log that holds one Xid line, so the Xid counter has a series too.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from observe_agent import agent_fixture  # noqa: F401 - provides the `agent` fixture

pytestmark = pytest.mark.realparts

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
XID_LINE = "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


def test_prometheus_scrapes_the_agent_and_loads_the_rules(agent, prometheus_factory) -> None:
    prom = prometheus_factory([agent.address], rule_files=[RULES])
    [info] = prom.wait_for('gpuvigil_agent_info{node="node-17"}', timeout=60)
    assert info["metric"]["instance"] == agent.address and info["value"][1] == "1"
    runs = prom.wait_for("sum by (result) (gpuvigil_check_runs_total)", timeout=60)
    assert {r["metric"]["result"] for r in runs} <= {"ok", "warning", "failed", "timeout", "error"}
    # Without a GPU the GPU checks cannot run: they must show up failing closed.
    closed = prom.wait_for("gpuvigil_check_could_not_run == 1", timeout=60)
    assert closed
    # The Xid line of the kernel log: counted, and the node condition is set.
    [xid] = prom.wait_for('gpuvigil_xid_events_total{code="79"}', timeout=60)
    assert xid["value"][1] == "1"
    prom.wait_for('gpuvigil_node_condition{condition="GPUXidError"} == 1', timeout=60)
    heartbeat = prom.wait_for("time() - gpuvigil_agent_loop_last_timestamp_seconds", timeout=60)
    assert float(heartbeat[0]["value"][1]) < 60
    # The server loaded every rule group of deploy/prometheus/rules.yaml.
    with urllib.request.urlopen(f"{prom.url}/api/v1/rules", timeout=5) as r:
        groups = json.load(r)["data"]["groups"]
    names = {g["name"] for g in groups}
    assert {"gpuvigil-slo-recording", "gpuvigil-node", "gpuvigil-agent"} <= names
    rules = [rule for g in groups for rule in g["rules"]]
    assert len(rules) >= 30
    assert all(rule.get("health") in ("ok", "unknown") for rule in rules), rules
