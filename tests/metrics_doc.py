"""docs/metrics.md's tables, and Prometheus exposition text, read for the docs tests
(`tests/unit/observe/test_metrics_doc.py`, the agent's in `tests/integration/observe`)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "metrics.md"
MODULES = ("gpuvigil.node.metrics", "gpuvigil.platform.metrics", "gpuvigil.training.metrics")
ROW = re.compile(r"^\| `(gpuvigil_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.M)
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    out = {}
    for name, kind, labels in ROW.findall(DOC.read_text()):
        out[name] = (kind, frozenset(re.findall(r"`([a-z_]+)`", labels)))
    return out


def exposition(module_name: str) -> str:
    registry = CollectorRegistry()
    importlib.import_module(module_name).build(registry)
    return generate_latest(registry).decode()


def families(text: str) -> dict[str, str]:
    """name -> type, from the `# TYPE` lines."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def series(text: str) -> set[str]:
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and ln[0] != "#"}


def belongs(name: str, doc: dict[str, tuple[str, frozenset[str]]]) -> bool:
    if name in doc:
        return True
    return any(name.endswith(s) and doc.get(name[: -len(s)], ("",))[0] == "histogram"
               for s in HISTOGRAM_SERIES)  # fmt: skip
