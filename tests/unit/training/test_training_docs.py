"""docs/training.md keeps in step with the code it describes: the exit-code table with
core.exit_codes, the settings with the config models, the metrics with metrics.build."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpuvigil.core import exit_codes
from gpuvigil.training import metrics
from gpuvigil.training.config import TrainingConfig

DOC = (Path(__file__).resolve().parents[3] / "docs" / "training.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 3)
    return DOC[start : end if end > 0 else None]


def test_exit_code_table_lists_every_code_of_core() -> None:
    rows = re.findall(r"^\| (\d+) \| \*\*([^*]+)\*\*", _section("Exit codes"), re.MULTILINE)
    assert {int(c) for c, _ in rows} == {c for c in exit_codes.TABLE if c != exit_codes.SUCCESS}


def test_every_documented_setting_exists() -> None:
    table = _section("The API: one `init`")
    for cell in re.findall(r"^\| `([a-z_.]+)`", table, re.MULTILINE):
        model = TrainingConfig()
        for part in cell.split("."):
            assert hasattr(model, part), f"docs/training.md documents {cell!r}, which is no setting"
            model = getattr(model, part)


def test_every_metric_is_documented() -> None:
    reg = CollectorRegistry()
    metrics.build(reg)
    names = {fam.name.removesuffix("_total") for fam in reg.collect()}
    for name in names:
        assert name in DOC, f"{name} is exported but not in docs/training.md"
