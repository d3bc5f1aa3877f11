"""The SLO targets have one definition (gpuvigil.core.slo_targets): `gpuvigil report`'s
defaults come from it, and every number in the alert rules (rules.yaml and the operator's
PrometheusRule) and the dashboard that is a target, an error budget or a burn-rate window
agrees with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpuvigil.core import slo_targets as t
from gpuvigil.observe.slo_report import Targets

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
# The prometheus-operator copy (regenerate.sh) ships the same thresholds: checked directly,
# not only through test_operator_manifests' equality with rules.yaml.
OPERATOR_RULE = ROOT / "deploy" / "prometheus" / "operator" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuvigil.json"
SLOS = {"node-availability": t.AVAILABILITY, "job-success": t.JOB_SUCCESS}
THRESHOLD = re.compile(r":ratio_rate(\w+) > \(([\d.]+) \* ([\d.]+)\)")


def burn_conditions(expr: str) -> list[tuple[float, str, str, float]]:
    """(factor, long window, short window, budget) of each `long and short` pair."""
    found = THRESHOLD.findall(expr)
    assert found and len(found) % 2 == 0, expr
    out = []
    for (lw, lf, lb), (sw, sf, sb) in zip(found[::2], found[1::2], strict=True):
        assert (lf, lb) == (sf, sb), expr  # both windows of a pair share the threshold
        out.append((float(lf), lw, sw, float(lb)))
    return out


def slo_alerts(path: Path = RULES) -> list[dict]:
    doc = yaml.safe_load(path.read_text())
    groups = doc["spec"]["groups"] if doc.get("kind") == "PrometheusRule" else doc["groups"]
    return [r for g in groups for r in g["rules"] if "slo" in r.get("labels", {})]


def test_report_defaults_are_the_targets() -> None:
    assert Targets() == Targets(availability=t.AVAILABILITY, job_success=t.JOB_SUCCESS)


def test_every_slo_has_its_page_and_ticket() -> None:
    got = {(r["labels"]["slo"], r["labels"]["severity"]) for r in slo_alerts()}
    assert got == {(slo, sev) for slo in SLOS for sev in ("page", "ticket")}


@pytest.mark.parametrize("path", [RULES, OPERATOR_RULE], ids=["rules", "prometheusrule"])
@pytest.mark.parametrize("slo", sorted(SLOS))
def test_rule_thresholds_agree_with_the_targets(slo: str, path: Path) -> None:
    budget = t.error_budget(SLOS[slo])
    windows = set()
    for rule in slo_alerts(path):
        if rule["labels"]["slo"] != slo:
            continue
        for factor, long_w, short_w, b in burn_conditions(rule["expr"]):
            assert b == budget, f"{rule['alert']}: budget {b}, target says {budget}"
            windows.add((factor, long_w, short_w, rule["labels"]["severity"]))
        assert f"{SLOS[slo] * 100:g}%" in rule["annotations"].get("description", "") or (
            rule["labels"]["severity"] == "ticket"
        )
    assert windows == set(t.BURN_WINDOWS)


def test_dashboard_numbers_agree_with_the_targets() -> None:
    d = json.loads(DASHBOARD.read_text())
    exprs = [x["expr"] for p in d["panels"] for x in p.get("targets", [])]
    budgets = [float(m) for e in exprs for m in re.findall(r"unavailability\S*\s*/\s*([\d.]+)", e)]
    budgets += [float(m) for e in exprs for m in re.findall(r"\]\)\s*/\s*([\d.]+)", e)]
    targets = [float(m) for e in exprs for m in re.findall(r"vector\(([\d.]+)\)", e)]
    assert budgets and targets, "the SLO panels were not found"
    assert set(budgets) == {t.error_budget(t.AVAILABILITY)}
    assert set(targets) == {t.AVAILABILITY}


def test_a_drifted_threshold_is_caught() -> None:
    bad = "x:ratio_rate1h > (14.4 * 0.001) and x:ratio_rate5m > (14.4 * 0.001)"
    [(factor, _, _, budget)] = burn_conditions(bad)
    assert factor == 14.4 and budget != t.error_budget(t.AVAILABILITY)
