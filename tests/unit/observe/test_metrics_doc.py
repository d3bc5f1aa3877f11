"""docs/metrics.md documents every metric each layer registers, with its type and labels.

Discovers the layers' metric modules that exist in this checkout (agent, controller,
training); each one's `build(registry)` runs on a fresh registry and every family it
registers must have a row in docs/metrics.md with the same type and label names.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "metrics.md"
MODULES = ("gpuvigil.node.metrics", "gpuvigil.platform.metrics", "gpuvigil.training.metrics")
ROW = re.compile(r"^\| `(gpuvigil_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.M)


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    out = {}
    for name, kind, labels in ROW.findall(DOC.read_text()):
        out[name] = (kind, frozenset(re.findall(r"`([a-z_]+)`", labels)))
    return out


def registered(module_name: str) -> dict[str, tuple[str, frozenset[str]]]:
    module = importlib.import_module(module_name)
    registry = CollectorRegistry()
    module.build(registry)
    out = {}
    for collector in list(registry._collector_to_names):  # every family, labelled or not
        kind = collector._type
        name = collector._name + ("_total" if kind == "counter" else "")
        out[name] = (kind, frozenset(collector._labelnames))
    return out


def test_doc_rows_parse() -> None:
    doc = documented()
    assert len(doc) >= 30
    assert doc["gpuvigil_check_runs_total"] == ("counter", frozenset({"check", "result"}))
    assert doc["gpuvigil_nodes_in_service"] == ("gauge", frozenset())


@pytest.mark.parametrize("module_name", MODULES)
def test_every_registered_metric_is_documented(module_name: str) -> None:
    try:
        present = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError:
        present = False
    if not present:
        pytest.skip(f"{module_name} is not in this checkout (its layer's branch not merged)")
    doc = documented()
    got = registered(module_name)
    assert got, f"{module_name}.build registered nothing"
    missing = sorted(set(got) - set(doc))
    assert not missing, f"add these to docs/metrics.md: {missing}"
    wrong = {n: (got[n], doc[n]) for n in got if got[n] != doc[n]}
    assert not wrong, f"type/labels differ (registered, documented): {wrong}"
