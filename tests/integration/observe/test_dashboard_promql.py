"""Every dashboard query is valid PromQL: promtool parses each as a recording rule."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit import require_binary

pytestmark = pytest.mark.realparts

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuvigil.json"
# Grafana variables replaced by what Grafana would send.
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*"}


def _exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text())
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            expr = t["expr"]
            for k, v in VARIABLES.items():
                expr = expr.replace(k, v)
            assert "$" not in expr, expr
            out.append(expr)
    return out


def _check(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess[str]:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)]}]}  # fmt: skip
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    exe = require_binary("promtool")
    return subprocess.run([exe, "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    exprs = _exprs()
    proc = _check(tmp_path, exprs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


def test_a_broken_query_is_caught(tmp_path: Path) -> None:
    proc = _check(tmp_path, ["sum by (check (gpuvigil_check_could_not_run)"])
    assert proc.returncode != 0


XID = 'gpuvigil_xid_events_total{instance="n1:9400",job="gpuvigil-agent",code="79",gpu="3"}'
# The Xid panels and the labels each keeps for that one Xid.
XID_PANELS = {
    "Xid heat map (events per code per hour)": '{code="79"}',
    "Xid heat map by node (events per hour)": '{instance="n1:9400"}',
    "Top Xid GPUs (24 h)": '{code="79",gpu="3",instance="n1:9400"}',
}


def _promtool_eval(tmp_path: Path, series: str, values: str, cases: list[dict]) -> str:
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [{"series": series, "values": values}],
                   "promql_expr_test": cases}],
    }  # fmt: skip
    path = tmp_path / "first_event_test.yaml"
    path.write_text(yaml.safe_dump(test))
    exe = require_binary("promtool")
    proc = subprocess.run([exe, "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def _panel_expr(title: str) -> str:
    d = json.loads(DASHBOARD.read_text())
    [p] = [p for p in d["panels"] if p["title"] == title]
    return p["targets"][0]["expr"]


def test_the_first_xid_counts(tmp_path: Path) -> None:
    """An Xid counter is born at 1 (its (code, gpu) is not known before the event): every
    Xid panel shows 1 for it, in the real promtool, and 2 after a second event."""
    cases = []
    for title, labels in XID_PANELS.items():
        expr = _panel_expr(title)
        for at, value in (("30m", 1), ("50m", 2)):
            sample = {"labels": labels, "value": value}
            cases.append({"expr": expr, "eval_time": at, "exp_samples": [sample]})
    # absent 10 minutes, born at 1, a second event at minute 40
    assert _promtool_eval(tmp_path, XID, "_x10 1x30 2x20", cases) == ""


def test_an_xid_before_the_agent_restarted_still_counts(tmp_path: Path) -> None:
    """A reboot restarts the agent: the Xid's series ends (the new agent has not seen it).
    The panels still count it for the rest of the window."""
    cases = []
    for title, labels in XID_PANELS.items():
        sample = {"labels": labels, "value": 1}
        cases.append({"expr": _panel_expr(title), "eval_time": "40m", "exp_samples": [sample]})
    assert _promtool_eval(tmp_path, XID, "_x10 1x10 stale _x30", cases) == ""


def test_plain_increase_misses_the_first_event(tmp_path: Path) -> None:
    """Why the panels need the `unless ... offset` term: increase() alone shows 0."""
    case = {"expr": "sum by (code) (increase(gpuvigil_xid_events_total[1h]))", "eval_time": "30m",
            "exp_samples": [{"labels": '{code="79"}', "value": 1}]}  # fmt: skip
    assert "got:" in _promtool_eval(tmp_path, XID, "_x10 1x30 2x20", [case])
