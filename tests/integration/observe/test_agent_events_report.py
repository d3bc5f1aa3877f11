"""The agent's real event log goes through `gpuvigil report` unchanged."""

from __future__ import annotations

import json
import subprocess

import pytest
from observe_agent import agent_fixture  # noqa: F401 - provides the `agent` fixture

from realparts.procs import wait_until
from testkit import cli_env, gpuvigil_argv

pytestmark = pytest.mark.realparts


def test_report_reads_the_agents_event_log(agent) -> None:
    def has_findings() -> bool:
        return agent.events.exists() and '"finding.set"' in agent.events.read_text()

    wait_until(has_findings, timeout=60, interval=0.5, what="finding.set in the agent's log")
    proc = subprocess.run(
        gpuvigil_argv("report", str(agent.events), "--window", "all", "--json"),
        env=cli_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["input"]["skipped"] == 0 and out["input"]["events"] >= 1
    assert out["events_by_kind"]["finding.set"] >= 1
    # No GPU here: the agent's findings are real, FAILED, and counted by code.
    assert sum(out["findings_by_code"].values()) >= 1
    # The Xid line in its kernel log, end to end: agent -> event log -> report.
    wait_until(lambda: '"XID_79"' in agent.events.read_text(), timeout=60, what="XID_79 event")
    proc = subprocess.run(
        gpuvigil_argv("report", str(agent.events), "--window", "all", "--json"),
        env=cli_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["findings_by_code"]["XID_79"] == 1
    assert [g["node"] for g in out["top_gpus"]] == ["node-17"]
