"""The whole config file: one section per component, each owned by the module it configures.

    node:        gpuvigil.node.config.NodeConfig          (checks, thresholds, catalog overrides)
    agent:       gpuvigil.node.agent.AgentConfig          (schedules, sinks)
    controller:  gpuvigil.platform.controller.ControllerConfig  (policy, safety, cluster)
    preflight:   gpuvigil.node.preflight.PreflightConfig    (active checks, time budget)

Unknown keys anywhere are errors naming the key and the file. A command loads only the
sections it uses (`load(..., sections=("node",))`), so `gpuvigil check` does not import the
controller: the other known sections are accepted as written and checked by the commands
that use them. `Config` is the model of the whole file.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, create_model

from gpuvigil.core import config as core_config
from gpuvigil.core.config import ConfigError, StrictModel

__all__ = ["ALL", "SECTIONS", "ConfigError", "load", "model"]  # and Config, built on use

# section -> (module, class): imported only when a command loads that section.
SECTIONS: dict[str, tuple[str, str]] = {
    "node": ("gpuvigil.node.config", "NodeConfig"),
    "agent": ("gpuvigil.node.agent", "AgentConfig"),
    "controller": ("gpuvigil.platform.controller", "ControllerConfig"),
    "preflight": ("gpuvigil.node.preflight", "PreflightConfig"),
}
ALL = tuple(SECTIONS)


@functools.cache
def model(sections: tuple[str, ...] = ALL) -> type[StrictModel]:
    """The file's model with `sections` validated; the other sections taken as written."""
    fields: dict[str, Any] = {}
    for name, (module, cls) in SECTIONS.items():
        if name in sections:
            section = getattr(importlib.import_module(module), cls)
            fields[name] = (section, Field(default_factory=section))
        else:
            fields[name] = (dict[str, Any], Field(default_factory=dict))
    return create_model("Config", __base__=StrictModel, **fields)


def __getattr__(name: str) -> Any:
    if name == "Config":  # the whole file, built on first use
        return model()
    raise AttributeError(name)


def load(
    path: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    sections: Iterable[str] = ALL,
) -> Any:
    """The config from `path` (and GPUVIGIL__SECTION__KEY variables, then `overrides`),
    with `sections` validated (default: all of them)."""
    wanted = tuple(s for s in SECTIONS if s in set(sections))
    return core_config.load(model(wanted), path, environ=environ, overrides=overrides)
