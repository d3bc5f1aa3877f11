"""deploy/prometheus/rules.yaml with the real promtool: valid, and every alert tested
both firing and not firing (tests/integration/observe/promtool/*_test.yaml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from testkit import require_binary

pytestmark = pytest.mark.realparts

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
TESTS = sorted((Path(__file__).parent / "promtool").glob("*_test.yaml"))


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = require_binary("promtool")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)


def _alerts() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_rules_pass_promtool_check() -> None:
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize("test_file", TESTS, ids=[t.stem for t in TESTS])
def test_promtool_unit_tests(test_file: Path) -> None:
    proc = _promtool("test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for t in TESTS:
        for case in yaml.safe_load(t.read_text())["tests"]:
            for a in case.get("alert_rule_test", []):
                (firing if a.get("exp_alerts") else quiet).add(a["alertname"])
    alerts = _alerts()
    assert alerts - firing == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested quiet"
    assert len(alerts) >= 15  # the parse found the rules


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """The harness can fail: the same inputs with an expectation flipped must not pass."""
    doc = yaml.safe_load((Path(__file__).parent / "promtool" / "agent_test.yaml").read_text())
    doc["rule_files"] = [str(RULES)]
    case = doc["tests"][0]
    for a in case["alert_rule_test"]:
        if a["alertname"] == "GpuvigilAgentDown" and a["exp_alerts"]:
            a["exp_alerts"] = []
    bad = tmp_path / "bad_test.yaml"
    bad.write_text(yaml.safe_dump(doc))
    proc = _promtool("test", "rules", str(bad))
    assert proc.returncode == 1 and "GpuvigilAgentDown" in proc.stdout + proc.stderr
