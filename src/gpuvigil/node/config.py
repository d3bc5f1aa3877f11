"""Settings of the layer-1 checks: the `node:` section of the config file.

One sub-model per area, each owned by that area's probe and rules.
"""

from __future__ import annotations

from typing import Any, Literal

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
    """What the fabric and PCIe checks expect (`node.fabric`). See docs/fabric.md."""

    # Overrides of the instance catalog's figures for this node (None: from the catalog).
    expect_adapters: int | None = Field(default=None, ge=0)
    kind: Literal["efa", "ib", "roce"] | None = None
    expect_rate_gbps: float | None = Field(default=None, gt=0)
    # Glob patterns of the compute adapters (e.g. ["mlx5_[0-7]"]); empty: every adapter of
    # the expected kind. Storage/in-band NICs outside the patterns are not judged.
    adapters: list[str] = Field(default_factory=list)
    # Added or changed catalog entries, same shape as node/catalog/instances.yaml.
    instances: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Error counters judged as increases per hour between two readings. Above `fail`:
    # FAILED; above `warn`: WARNING. A link that went down even once is a lost NCCL job
    # on a gang, hence link_downed 0; the others tolerate the odd retrained symbol.
    error_fail_per_h: dict[str, float] = Field(default_factory=lambda: {"link_downed": 0.0})
    error_warn_per_h: dict[str, float] = Field(
        default_factory=lambda: {
            "symbol_error": 60.0,
            "link_error_recovery": 6.0,
            "port_rcv_errors": 60.0,
            "port_rcv_remote_physical_errors": 60.0,
            "local_link_integrity_errors": 6.0,
            "excessive_buffer_overrun_errors": 6.0,
            # EFA device counters (the EFA driver's link state cannot be trusted).
            "retrans_timeout_events": 6.0,
            "unresponsive_remote_events": 6.0,
            "impaired_remote_conn_events": 6.0,
        }
    )
    # `fi_info -p efa` is the second source for EFA devices; it is run when present.
    require_fi_info: bool = False  # True: a missing fi_info on an EFA node is a failure
    fi_info_timeout_s: float = Field(default=10.0, gt=0)  # it loads providers: ~1 s
    # GPUs lower their PCIe speed when idle to save power, so a GPU below its maximum
    # speed is normal at rest; width below maximum is always a fault. Set True to judge
    # GPU speed too (e.g. while a load runs). Adapters are always judged on both.
    pcie_judge_gpu_speed: bool = False


class NodeConfig(StrictModel):
    expect_gpus: int | None = None  # None: from the instance type, else from what is found
    instance_type: str | None = None  # e.g. p5.48xlarge; None: detected where possible
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    dcgm: DcgmConfig = Field(default_factory=DcgmConfig)
    kernel_log: KernelLogConfig = Field(default_factory=KernelLogConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
