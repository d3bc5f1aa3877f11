"""The GPU product catalog (`gpus.yaml`): product name -> family, memory, NVLink links and
fallback temperature limits. Loaded by the GPU checks and `analyze`; pure data, validated.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from pydantic import Field

from gpuvigil.core.config import StrictModel, load_shipped_yaml, validate


class GpuProduct(StrictModel):
    match: str
    family: str
    memory_gib: int = Field(ge=0)
    nvlinks: int = Field(ge=0, le=36)
    gpu_max_c: float
    memory_max_c: float
    board_pcie_width: int | None = Field(default=None, ge=1, le=32)


class GpuCatalog(StrictModel):
    products: tuple[GpuProduct, ...] = ()

    def lookup(self, name: str | None) -> GpuProduct | None:
        """The first product whose `match` is in `name` (case-insensitive)."""
        if not name:
            return None
        low = name.lower()
        return next((p for p in self.products if p.match.lower() in low), None)


@lru_cache(maxsize=1)
def load() -> GpuCatalog:
    text = resources.files("gpuvigil.node.catalog").joinpath("gpus.yaml").read_text()
    return validate(GpuCatalog, load_shipped_yaml(text), source="gpuvigil/node/catalog/gpus.yaml")
