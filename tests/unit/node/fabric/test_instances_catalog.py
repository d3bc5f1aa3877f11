"""The instance catalog: built-in facts, aliases, user overrides, validation."""

from __future__ import annotations

import pytest

from gpuvigil.core.config import ConfigError
from gpuvigil.node.catalog.instances import load_catalog
from gpuvigil.node.checks.fabric.rules import expectation
from gpuvigil.node.config import FabricConfig


def test_builtin_facts():
    cat = load_catalog()
    p5 = cat.lookup("p5.48xlarge")
    assert p5 is not None
    _, entry = p5
    assert (entry.gpus, entry.fabric.kind, entry.fabric.count) == (8, "efa", 32)
    assert cat.lookup("p4d.24xlarge")[1].fabric.count == 4
    assert cat.lookup("p5en.48xlarge")[1].fabric.count == 16
    assert cat.lookup("standard_nd96isr_h100_v5")[1].fabric.rate_gbps == 400
    assert cat.lookup("DGX H100")[0] == "dgx-h100"  # DMI product name alias
    assert cat.lookup("a3-highgpu-8g")[1].fabric is None
    assert cat.lookup("nope") is None and cat.lookup(None) is None
    for name, entry in cat.entries.items():
        assert entry.source, f"{name} cites no source"


def test_override_and_extend():
    cat = load_catalog(
        {
            "p5.48xlarge": {"fabric": {"count": 16}},
            "my-box": {"gpus": 4, "fabric": {"kind": "roce", "count": 2}},
        }
    )
    assert cat.lookup("p5.48xlarge")[1].fabric.count == 16
    assert cat.lookup("p5.48xlarge")[1].fabric.kind == "efa"  # merged, not replaced
    assert cat.lookup("my-box")[1].gpus == 4


def test_bad_override_names_the_key():
    with pytest.raises(ConfigError) as e:
        load_catalog({"p5.48xlarge": {"fabric": {"cuont": 16}}})
    assert "instances.p5.48xlarge.fabric.cuont" in str(e.value)


def test_expectation_precedence():
    cat = load_catalog()
    exp = expectation(FabricConfig(), cat.lookup("p5.48xlarge"))
    assert (exp.kind, exp.count, exp.source) == ("efa", 32, "catalog:p5.48xlarge")
    exp = expectation(FabricConfig(expect_adapters=4), cat.lookup("p5.48xlarge"))
    assert (exp.count, exp.source) == (4, "config")
    assert expectation(FabricConfig(), cat.lookup("a3-highgpu-8g")).count == 0
    assert expectation(FabricConfig()).count is None
