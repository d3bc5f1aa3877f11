"""Error-counter thresholds for one capture (`error_counters.yaml`): data, not code.

Read by `rules.counts` (NVLink, InfiniBand and ethtool counters that `gpuvigil analyze`
reads from pasted outputs).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gpuvigil.core.config import StrictModel, validate


class Limit(StrictModel):
    warn_above: int = Field(ge=0)
    fail_above: int | None = Field(default=None, ge=0)
    source: str = ""


class Pattern(Limit):
    match: str  # a regular expression searched in the counter's name


class CounterLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int
    nvlink: dict[str, Limit]
    ib: dict[str, Limit]
    ethtool: dict[str, Limit]
    ethtool_patterns: tuple[Pattern, ...] = ()

    def ethtool_limit(self, name: str) -> Limit | None:
        """The named limit, else the first pattern that matches the name."""
        hit = self.ethtool.get(name)
        if hit is not None:
            return hit
        return next((p for p in self.ethtool_patterns if re.search(p.match, name)), None)


@cache
def load() -> CounterLimits:
    text = resources.files(__package__).joinpath("error_counters.yaml").read_text("utf-8")
    return validate(CounterLimits, yaml.safe_load(text), source="error_counters.yaml")
