"""Settings of the layer-1 checks: the `node:` section of the config file.

One sub-model per area, each owned by that area's probe and rules.
"""

from __future__ import annotations

from pydantic import Field

from gpuvigil.core.config import StrictModel


# --- GPU: NVML, nvidia-smi, thermal/ECC thresholds (layer-1 GPU work) ----------------------
class GpuConfig(StrictModel):
    pass


# --- DCGM (layer-1 GPU work) ---------------------------------------------------------------
class DcgmConfig(StrictModel):
    pass


# --- Kernel log, Xid/SXid catalog overrides (layer-1 kernel-log work) ----------------------
class KernelLogConfig(StrictModel):
    pass


# --- Network fabric and PCIe (fabric/preflight work) ---------------------------------------
class FabricConfig(StrictModel):
    pass


class NodeConfig(StrictModel):
    expect_gpus: int | None = None  # None: from the instance type, else from what is found
    instance_type: str | None = None  # e.g. p5.48xlarge; None: detected where possible
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    dcgm: DcgmConfig = Field(default_factory=DcgmConfig)
    kernel_log: KernelLogConfig = Field(default_factory=KernelLogConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
