"""Every alert's runbook_url names a real section of docs/runbooks.md, and every section
there is an alert (no runbook for an alert that is gone)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for title in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def alerts() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_every_alert_links_a_real_runbook_section() -> None:
    have = anchors(RUNBOOKS.read_text())
    for name, rule in alerts().items():
        url = rule.get("annotations", {}).get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page == "docs/runbooks.md", f"{name}: runbook_url {url!r}"
        assert anchor == name.lower() and anchor in have, f"{name}: no section #{anchor}"


def test_every_runbook_section_is_an_alert_and_links_resolve() -> None:
    text = RUNBOOKS.read_text()
    sections = set(re.findall(r"^## (Gpuvigil\w+)$", text, re.M))
    assert sections == set(alerts())
    have = anchors(text)
    for link in re.findall(r"\]\(#([\w-]+)\)", text):
        assert link in have, f"broken in-page link #{link}"


def test_the_anchor_rule_is_github_s() -> None:
    assert anchors("## GpuvigilFatalXid\n## Prometheus: scrape and alert\n") == {
        "gpuvigilfatalxid",
        "prometheus-scrape-and-alert",
    }
