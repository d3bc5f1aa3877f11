"""deploy/grafana/gpuvigil.json is a valid Grafana dashboard whose every query uses only
documented metrics; the alert rules use only documented metrics too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .test_metrics_doc import documented

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuvigil.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
METRIC = re.compile(r"\b(gpuvigil_[a-z0-9_]+|gpuvigil:[a-z0-9_:]+)")
HIST_SUFFIX = re.compile(r"_(bucket|sum|count)$")


def _recorded() -> set[str]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def unknown_metrics(expr: str) -> set[str]:
    doc = documented()
    recorded = _recorded()
    bad = set()
    for name in METRIC.findall(expr):
        if name in doc or name in recorded:
            continue
        base = HIST_SUFFIX.sub("", name)
        if base != name and doc.get(base, ("",))[0] == "histogram":
            continue
        bad.add(name)
    return bad


def queries(dashboard: dict) -> list[tuple[str, str]]:
    out = []
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for v in dashboard["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            out.append((f"variable {v['name']}", q["query"]))
    return out


def test_dashboard_shape() -> None:
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and isinstance(d["schemaVersion"], int)
    assert {v["name"] for v in d["templating"]["list"]} >= {"datasource", "node"}
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    kinds = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0 and g["y"] >= 0, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        kinds.add(p["type"])
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
    assert {"stat", "timeseries", "heatmap", "row", "table", "state-timeline"} <= kinds
    titles = " ".join(p["title"] for p in d["panels"] if p["type"] == "row")
    for section in ("Fleet health", "Remediation pipeline", "SLOs", "Xid"):
        assert section in titles


def test_every_dashboard_query_uses_documented_metrics() -> None:
    d = json.loads(DASHBOARD.read_text())
    qs = queries(d)
    assert len(qs) > 30
    bad = {title: unknown_metrics(expr) for title, expr in qs if unknown_metrics(expr)}
    assert not bad


def test_every_rule_uses_documented_metrics() -> None:
    doc = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in doc["groups"] for r in g["rules"]]
    bad = {e: unknown_metrics(e) for e in exprs if unknown_metrics(e)}
    assert not bad


def test_an_undocumented_metric_is_caught() -> None:
    assert unknown_metrics("rate(gpuvigil_made_up_total[5m])") == {"gpuvigil_made_up_total"}
    assert unknown_metrics("rate(gpuvigil_check_duration_seconds_bucket[5m])") == set()
    assert unknown_metrics("gpuvigil_nodes_total_bucket") == {"gpuvigil_nodes_total_bucket"}
