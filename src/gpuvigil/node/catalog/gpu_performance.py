"""Expected throughput per GPU model (`gpu_performance.yaml`), for the active checks.

Read by `node/active` (the matmul, load and bandwidth checks compare what they achieve
with these figures) and by `bench/active.py` (achieved / peak). No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuvigil.core.config import StrictModel, deep_merge, load_shipped_yaml, validate


class DenseTflops(StrictModel):
    bf16: float | None = Field(default=None, gt=0)
    fp16: float | None = Field(default=None, gt=0)
    tf32: float | None = Field(default=None, gt=0)
    fp32: float | None = Field(default=None, gt=0)


class GpuModel(StrictModel):
    match: tuple[str, ...]  # substrings that must all appear in the device name
    dense_tflops: DenseTflops = Field(default_factory=DenseTflops)
    memory_gbs: float | None = None
    h2d_gbs: float | None = Field(default=None, gt=0)
    p2p_gbs: float | None = Field(default=None, gt=0)
    source: str = ""


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    models: dict[str, GpuModel]


@cache
def _builtin_raw() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("gpu_performance.yaml").read_text("utf-8")
    return load_shipped_yaml(text)


def load_models(overrides: Mapping[str, Any] | None = None) -> dict[str, GpuModel]:
    raw = _builtin_raw()
    if overrides:
        raw = deep_merge(raw, {"models": dict(overrides)})
    source = "gpu_performance.yaml" + (" + preflight.active.gpu_models" if overrides else "")
    return dict(validate(_File, raw, source=source).models)


def identify(device_name: str, models: Mapping[str, GpuModel]) -> tuple[str, GpuModel] | None:
    """The first model whose `match` substrings all occur in `device_name` (case-insensitive)."""
    name = device_name.lower()
    for key, model in models.items():
        if model.match and all(m.lower() in name for m in model.match):
            return key, model
    return None
