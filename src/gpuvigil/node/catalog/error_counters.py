"""Error-counter thresholds for one capture (`error_counters.yaml`): data, not code.

Read by `rules.counts` (NVLink, InfiniBand and ethtool counters that `gpuvigil analyze`
reads from pasted outputs), and by `platform.isolation` (`gpu_local`: which finding codes
of a GPU's own error counters are confined to that GPU).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuvigil.core import codes
from gpuvigil.core.config import StrictModel, load_shipped_yaml, validate


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
    # Finding codes of a GPU's own error counters (ECC, retired pages, row remapping)
    # whose fault is confined to that GPU: per-GPU isolation may apply to them.
    gpu_local: tuple[str, ...] = ()

    @field_validator("gpu_local")
    @classmethod
    def _known_codes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in v if c not in codes.CODES]
        if unknown:
            raise ValueError(f"not finding codes (core.codes): {', '.join(unknown)}")
        return v

    def ethtool_limit(self, name: str) -> Limit | None:
        """The named limit, else the first pattern that matches the name."""
        hit = self.ethtool.get(name)
        if hit is not None:
            return hit
        return next((p for p in self.ethtool_patterns if re.search(p.match, name)), None)


@cache
def load() -> CounterLimits:
    text = resources.files(__package__).joinpath("error_counters.yaml").read_text("utf-8")
    return validate(CounterLimits, load_shipped_yaml(text), source="error_counters.yaml")
