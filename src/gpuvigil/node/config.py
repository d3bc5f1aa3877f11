"""Settings of the layer-1 checks (the `node:` section of the config file)."""

from __future__ import annotations

from gpuvigil.core.config import StrictModel


class NodeConfig(StrictModel):
    """Filled in by the layer-1 work: expected counts, thresholds, catalog overrides, sources."""

    expect_gpus: int | None = None  # None: from the instance type, else from what is found
    instance_type: str | None = None
