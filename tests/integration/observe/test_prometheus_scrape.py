"""A real Prometheus server scrapes a running `gpuvigil agent` on loopback, loads
gpuvigil's alert rules, and answers queries for the agent's metrics over its HTTP API.

The agent runs for real (no GPU here: its GPU checks fail closed, which is what it must
do) with a kernel log that holds one Xid line, so the Xid counter has a series too.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path

import pytest

from conftest import cli_env, gpuvigil_argv, require
from realparts.procs import Proc, free_port, wait_until

pytestmark = pytest.mark.realparts

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
XID_LINE = "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


def _has_agent() -> bool:
    return importlib.util.find_spec("gpuvigil.node.metrics") is not None


@pytest.fixture
def agent(tmp_path: Path):
    require(_has_agent(), "the agent (branch agent) is not in this checkout")
    kern = tmp_path / "kern.log"
    kern.write_text(XID_LINE)
    port = free_port()
    argv = gpuvigil_argv(
        "agent", "--kmsg-file", str(kern), "--state-file", str(tmp_path / "report.json"),
        "--listen", f"127.0.0.1:{port}", "--interval", "2", "--node-name", "node-17",
        "--sink", "state-file", "--sink", "http",
    )  # fmt: skip
    proc = Proc(argv, log=tmp_path / "agent.log", env=cli_env())
    url = f"http://127.0.0.1:{port}/metrics"

    def serving() -> bool:
        if not proc.alive():
            raise RuntimeError("agent exited:\n" + proc.log_tail())
        with urllib.request.urlopen(url, timeout=2) as r:
            return b"gpuvigil_agent_info" in r.read()

    try:
        wait_until(serving, timeout=60, interval=0.2, what="agent /metrics")
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop()


def test_prometheus_scrapes_the_agent_and_loads_the_rules(agent: str, prometheus_factory) -> None:
    prom = prometheus_factory([agent], rule_files=[RULES])
    [info] = prom.wait_for('gpuvigil_agent_info{node="node-17"}', timeout=60)
    assert info["metric"]["instance"] == agent and info["value"][1] == "1"
    runs = prom.wait_for("sum by (result) (gpuvigil_check_runs_total)", timeout=60)
    assert {r["metric"]["result"] for r in runs} <= {"ok", "warning", "failed", "timeout", "error"}
    # Without a GPU the GPU checks cannot run: they must show up failing closed.
    closed = prom.wait_for("gpuvigil_check_could_not_run == 1", timeout=60)
    assert closed
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
