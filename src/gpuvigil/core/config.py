"""Config loading shared by every command: YAML file + environment, validated by pydantic.

Each module owns its settings model (a `StrictModel`); the root model in
`gpuvigil.config` composes them. An error names the file and the dotted key.
Environment overrides use `GPUVIGIL__SECTION__KEY=value` (values parsed as YAML scalars).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

ENV_PREFIX = "GPUVIGIL__"

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every settings model: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(Exception):
    """A config problem, naming where it is: `file: key: what is wrong`."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key or '<root>'}: {problem}")


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_shipped_yaml(text: str) -> Any:
    """`yaml.safe_load` of a file shipped with gpuvigil (a catalog), with libyaml's loader
    when it is there: the same objects, ~10x faster (phrases.yaml and instances.yaml
    took 0.1 s of `analyze`'s start-up). A person's config file keeps `safe_load`,
    whose error messages the config errors quote."""
    return yaml.load(text, Loader=_LOADER)  # a safe loader (C when available)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(path), "", f"cannot read: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(path), "", f"not valid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "", "the top level must be a mapping")
    return data


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`GPUVIGIL__AGENT__INTERVAL_S=10` -> {"agent": {"interval_s": 10}}."""
    out: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
        else:
            node[path[-1]] = value
    return out


def deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(merged.get(k), dict):
            merged[k] = deep_merge(merged[k], v)
        else:
            merged[k] = v
    return merged


def validate(model: type[M], data: Mapping[str, Any], *, source: str) -> M:
    """Validate `data`, turning pydantic's first error into a ConfigError naming the key."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        problem = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ConfigError(source, key, problem) from e


def load(
    model: type[M],
    path: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> M:
    """File, then environment, then explicit overrides (command-line flags) win."""
    data: dict[str, Any] = read_yaml(path) if path is not None else {}
    source = str(path) if path is not None else "<defaults>"
    env = env_overrides(os.environ if environ is None else environ)
    if env:
        data = deep_merge(data, env)
        source = f"{source} (+ environment)"
    if overrides:
        data = deep_merge(data, overrides)
    return validate(model, data, source=source)
