from pathlib import Path

import pytest

from gpuvigil import config
from gpuvigil.core.config import ConfigError, env_overrides


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("node:\n  expect_gpu: 8\n")
    with pytest.raises(ConfigError) as e:
        config.load(p, environ={})
    assert str(p) in str(e.value) and "node.expect_gpu" in str(e.value)


def test_bad_value_and_bad_yaml(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("node:\n  expect_gpus: many\n")
    with pytest.raises(ConfigError, match="node.expect_gpus"):
        config.load(p, environ={})
    p.write_text("node: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(p, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "absent.yaml", environ={})


def test_environment_overrides_file(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("node:\n  expect_gpus: 8\n")
    c = config.load(p, environ={"GPUVIGIL__NODE__EXPECT_GPUS": "4"})
    assert c.node.expect_gpus == 4
    assert env_overrides({"OTHER": "1", "GPUVIGIL__A__B": "x"}) == {"a": {"b": "x"}}
