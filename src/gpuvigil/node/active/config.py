"""Settings of the active checks (`preflight.active`). See docs/preflight.md.

Sizes left at None are chosen per device: GPU sizes are large enough to reach the
hardware's throughput, CPU sizes small enough to run in seconds on a laptop or CI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from gpuvigil.core.config import StrictModel

CheckName = Literal["matmul", "load", "memory", "bandwidth", "allreduce"]
Dtype = Literal["bf16", "fp16", "tf32", "fp32"]
ALL_CHECKS: tuple[str, ...] = ("matmul", "memory", "bandwidth", "load", "allreduce")
MiB = 1 << 20
GiB = 1 << 30


class ExpectedFigures(StrictModel):
    """Override the catalog's figures for this node (any device, including the CPU)."""

    tflops: dict[Dtype, float] = Field(default_factory=dict)  # dense peak per dtype
    h2d_gbs: float | None = Field(default=None, gt=0)  # host<->device, one direction
    p2p_gbs: float | None = Field(default=None, gt=0)  # GPU->GPU, one direction
    allreduce_busbw_gbs: float | None = Field(default=None, gt=0)  # within the node
    internode_busbw_gbs: float | None = Field(default=None, gt=0)  # across nodes


class Peers(StrictModel):
    """Cross-node all-reduce: every node runs preflight with the same master and nnodes."""

    master_addr: str
    master_port: int = Field(default=29533, ge=1, le=65535)
    nnodes: int = Field(ge=2)
    node_rank: int = Field(ge=0)


class ActiveConfig(StrictModel):
    checks: list[CheckName] = Field(default_factory=lambda: list(ALL_CHECKS))
    # bf16/fp16: the training dtypes; tf32: fp32 inputs on Tensor Cores; fp32: exact path.
    dtypes: list[Dtype] = Field(default_factory=lambda: ["bf16", "fp16", "tf32", "fp32"])
    matmul_size: int | None = Field(default=None, ge=8)  # GPU 2048, CPU 48
    matmul_repeats: int = Field(default=3, ge=2)  # results must be identical across repeats
    load_s: float | None = Field(default=None, gt=0)  # sustained load; GPU 15 s, CPU 1 s
    load_size: int | None = Field(default=None, ge=8)  # GPU 8192 (peak-reaching), CPU 96
    # A GPU below this fraction of its dense peak is GPU_SLOW. Large bf16 GEMMs reach
    # 60-80% of the datasheet peak on healthy H100/A100; a throttled or power-braked GPU
    # falls well below half.
    min_fraction_of_peak: float = Field(default=0.4, gt=0, le=1)
    # A GPU this much slower than the node's median is GPU_SLOW too: in a gang, the
    # slowest GPU sets everyone's step time.
    min_fraction_of_median: float = Field(default=0.8, gt=0, le=1)
    memory_fraction: float = Field(default=0.75, gt=0, le=0.95)  # of free device memory
    memory_bytes_cpu: int = Field(default=8 * MiB, ge=MiB)
    transfer_bytes: int | None = Field(default=None, ge=4096)  # GPU 1 GiB, CPU 8 MiB
    min_bandwidth_fraction: float = Field(default=0.5, gt=0, le=1)  # PCIE_SLOW/NVLINK_SLOW
    allreduce_bytes: int | None = Field(default=None, ge=4096)  # GPU 256 MiB, CPU 1 MiB
    min_allreduce_fraction: float = Field(default=0.5, gt=0, le=1)  # NVLINK/FABRIC_SLOW
    cpu_devices: int = Field(default=2, ge=1, le=8)  # virtual devices on --device cpu
    peers: Peers | None = None
    expected: ExpectedFigures = Field(default_factory=ExpectedFigures)
    gpu_models: dict[str, dict[str, Any]] = Field(default_factory=dict)  # catalog overrides
    timeouts_s: dict[CheckName, float] = Field(default_factory=dict)  # per-check deadline

    def sizes(self, device: str) -> Sizes:
        gpu = device != "cpu"
        load_s = self.load_s if self.load_s is not None else (15.0 if gpu else 1.0)
        defaults = {
            "matmul": 60.0,
            "memory": 120.0,
            "bandwidth": 60.0,
            "load": load_s + 45.0,
            "allreduce": 120.0,
        }
        if not gpu:
            defaults = {k: min(v, 60.0) for k, v in defaults.items()} | {"load": load_s + 30}
        return Sizes(
            device=device,
            matmul_size=self.matmul_size or (2048 if gpu else 48),
            load_s=load_s,
            load_size=self.load_size or (8192 if gpu else 96),
            load_dtype="bf16" if gpu else "fp32",
            transfer_bytes=self.transfer_bytes or (GiB if gpu else 8 * MiB),
            allreduce_bytes=self.allreduce_bytes or (256 * MiB if gpu else MiB),
            timeouts_s=defaults | dict(self.timeouts_s),
        )


@dataclass(frozen=True)
class Sizes:
    device: str
    matmul_size: int
    load_s: float
    load_size: int
    load_dtype: str
    transfer_bytes: int
    allreduce_bytes: int
    timeouts_s: dict[str, float]
