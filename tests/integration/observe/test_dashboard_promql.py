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
