"""The config examples in docs/fabric.md and docs/preflight.md are valid configs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpuvigil.config import Config
from gpuvigil.core.config import validate
from gpuvigil.node.catalog.instances import load_catalog

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.parametrize("doc", ["fabric.md", "preflight.md"])
def test_yaml_examples_validate(doc):
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / doc).read_text(), re.S)
    assert blocks
    for text in blocks:
        cfg = validate(Config, yaml.safe_load(text), source=doc)
        load_catalog(cfg.node.fabric.instances or None)  # overrides are validated too
