"""docs/metrics.md and what the processes export agree, both ways.

Each layer's metric module (agent, controller, training) builds its registry, which is
rendered as Prometheus text exposition, exactly what `/metrics` serves. Every series
name in it must be a documented metric (histograms add `_bucket`, `_sum`, `_count`; no
undocumented `_created` series), with the documented type and labels; every documented
metric must be exported by one of them. The integration test
`tests/integration/observe/test_agent_metrics_documented.py` holds a running agent's
`/metrics` to the same table.
"""

from __future__ import annotations

import importlib

import pytest
from prometheus_client import CollectorRegistry

from metrics_doc import MODULES, ROOT, ROW, belongs, documented, exposition, families, series


def test_doc_rows_parse() -> None:
    doc = documented()
    assert len(doc) >= 30
    assert doc["gpuvigil_check_runs_total"] == ("counter", frozenset({"check", "result"}))
    assert doc["gpuvigil_nodes_in_service"] == ("gauge", frozenset())


@pytest.mark.parametrize("module_name", MODULES)
def test_every_exported_series_is_documented(module_name: str) -> None:
    doc = documented()
    text = exposition(module_name)
    got = families(text)
    assert got, f"{module_name}.build registered nothing"
    missing = sorted(n for n in got if n not in doc)
    assert not missing, f"add these to docs/metrics.md: {missing}"
    wrong = {n: (t, doc[n][0]) for n, t in got.items() if t != doc[n][0]}
    assert not wrong, f"type differs (exported, documented): {wrong}"
    undocumented = sorted(s for s in series(text) if not belongs(s, doc))
    assert not undocumented, f"series not in docs/metrics.md (e.g. _created): {undocumented}"


@pytest.mark.parametrize("module_name", MODULES)
def test_labels_match(module_name: str) -> None:
    doc = documented()
    registry = CollectorRegistry()
    importlib.import_module(module_name).build(registry)
    for collector in list(registry._collector_to_names):  # every family, labelled or not
        if not hasattr(collector, "_name"):  # a custom collector: its described families
            for fam in collector.describe():
                assert frozenset(fam._labelnames) == doc[fam.name][1], fam.name
            continue
        name = collector._name + ("_total" if collector._type == "counter" else "")
        assert frozenset(collector._labelnames) == doc[name][1], name


def test_every_documented_metric_is_exported() -> None:
    exported: set[str] = set()
    for m in MODULES:
        exported |= set(families(exposition(m)))
    gone = sorted(set(documented()) - exported)
    assert not gone, f"documented in docs/metrics.md but exported by no process: {gone}"


def test_the_check_catches_an_undocumented_created_series() -> None:
    doc = documented()
    assert not belongs("gpuvigil_check_runs_created", doc)
    assert belongs("gpuvigil_check_duration_seconds_bucket", doc)


def test_no_other_page_restates_the_metric_tables() -> None:
    """One table: a second copy in another page drifted (docs/agent.md had its own)."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "metrics.md":
            rows = ROW.findall(page.read_text())
            assert not rows, f"{page.name} restates metrics {[r[0] for r in rows][:3]}"
