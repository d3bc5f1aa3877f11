"""The whole config file: one section per component, each owned by the module it configures.

    node:        gpuvigil.node.config.NodeConfig          (checks, thresholds, catalog overrides)
    agent:       gpuvigil.node.agent.AgentConfig          (schedules, sinks)
    controller:  gpuvigil.platform.controller.ControllerConfig  (policy, safety, cluster)
    preflight:   gpuvigil.platform.preflight.PreflightConfig    (active checks, time budget)

Unknown keys anywhere are errors naming the key and the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from gpuvigil.core import config as core_config
from gpuvigil.core.config import ConfigError, StrictModel
from gpuvigil.node.agent import AgentConfig
from gpuvigil.node.config import NodeConfig
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.preflight import PreflightConfig

__all__ = ["Config", "ConfigError", "load"]


class Config(StrictModel):
    node: NodeConfig = Field(default_factory=NodeConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)


def load(
    path: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    return core_config.load(Config, path, environ=environ, overrides=overrides)
