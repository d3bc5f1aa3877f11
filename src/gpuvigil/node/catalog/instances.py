"""The instance-type catalog: GPUs and compute-fabric adapters a healthy machine has.

Data lives in `instances.yaml` (cited there); users override or add entries under
`node.fabric.instances`. Read by the fabric check (adapter count and rate), by the GPU
checks (expected GPU count), by preflight (which GPU model to expect) and by the simulator.
Loading validates everything: a bad entry is a ConfigError naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuvigil.core.config import ConfigError, StrictModel, deep_merge, load_shipped_yaml, validate

FabricKind = Literal["efa", "ib", "roce"]


class FabricSpec(StrictModel):
    """The compute fabric of one instance type."""

    kind: FabricKind
    count: int = Field(ge=0)  # compute adapters (EFA devices, or IB/RoCE ports)
    rate_gbps: float | None = Field(default=None, gt=0)  # per port; None: not judged
    total_gbps: float | None = Field(default=None, gt=0)  # the node's fabric bandwidth


class InstanceType(StrictModel):
    gpus: int = Field(ge=0)
    gpu_model: str | None = None  # a key of gpu_performance.yaml, e.g. "H100-SXM5-80GB"
    fabric: FabricSpec | None = None  # None: no RDMA fabric to count
    aliases: tuple[str, ...] = ()  # other names (DMI product names, HGX board names)
    source: str = ""  # where the facts come from


class _CatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    instances: dict[str, InstanceType]


class InstanceCatalog:
    """Lookup by name or alias, case-insensitive."""

    def __init__(self, entries: Mapping[str, InstanceType]) -> None:
        self.entries = dict(entries)
        self._index: dict[str, str] = {}
        for name, entry in self.entries.items():
            for key in (name, *entry.aliases):
                self._index[key.strip().lower()] = name

    def lookup(self, name: str | None) -> tuple[str, InstanceType] | None:
        """(canonical name, entry), or None for an unknown or empty name."""
        if not name:
            return None
        canonical = self._index.get(name.strip().lower())
        return (canonical, self.entries[canonical]) if canonical else None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.lookup(name) is not None


@cache
def _builtin_raw() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("instances.yaml").read_text(encoding="utf-8")
    data = load_shipped_yaml(text)
    if not isinstance(data, dict):
        raise ConfigError("instances.yaml", "", "the top level must be a mapping")
    return data


def load_catalog(overrides: Mapping[str, Any] | None = None) -> InstanceCatalog:
    """The built-in catalog with the user's entries merged over it (key by key)."""
    raw = _builtin_raw()
    if overrides:
        raw = deep_merge(raw, {"instances": dict(overrides)})
    source = "instances.yaml" + (" + node.fabric.instances" if overrides else "")
    parsed = validate(_CatalogFile, raw, source=source)
    return InstanceCatalog(parsed.instances)
