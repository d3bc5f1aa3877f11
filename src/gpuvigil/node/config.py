"""Settings of the layer-1 checks: the `node:` section of the config file.

One sub-model per area, each owned by that area's probe and rules.
"""

from __future__ import annotations

from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from gpuvigil.core.config import StrictModel
from gpuvigil.node.catalog.xid import CatalogOverrides, load_catalog


# --- GPU: NVML, nvidia-smi, thermal/ECC thresholds (layer-1 GPU work) ----------------------
class GpuConfig(StrictModel):
    """GPU checks: where NVML comes from, how long it may take, and the thresholds."""

    # Python module that provides the pynvml API. "pynvml" is nvidia-ml-py, NVIDIA's own
    # binding; tests and the simulator use "gpuvigil.fakes.nvml".
    nvml_module: str = "pynvml"
    # Each GPU's own deadline. A healthy GPU answers all its NVML calls in milliseconds; a
    # hung driver call never returns, so the worker is killed after this long, that GPU is
    # CHECK_TIMEOUT, and a new worker reads the GPUs after it (one hung GPU hides nothing).
    nvml_timeout_s: float = Field(default=10.0, gt=0)
    # The whole NVML snapshot: GPUs still unread when it runs out (several hung GPUs) are
    # CHECK_TIMEOUT too. Below the `gpu` check's own 60 s deadline.
    nvml_budget_s: float = Field(default=45.0, gt=0)
    # NVLink links probed per GPU (NVML_NVLINK_MAX_LINKS is 36; probing stops at the first
    # link NVML does not support).
    nvlink_max_links: int = Field(default=36, ge=0, le=36)
    # Fall back to `nvidia-smi -q -x` when NVML is unusable (said so by SOURCE_FALLBACK).
    nvidia_smi_fallback: bool = True
    nvidia_smi_timeout_s: float = Field(default=30.0, gt=0)
    # Temperatures: None means "use the GPU's own slowdown threshold (NVML) minus the
    # margin, else the catalog's figure for the product".
    gpu_temperature_max_c: float | None = None
    memory_temperature_max_c: float | None = None
    temperature_margin_c: float = Field(default=5.0, ge=0)
    # Lifetime (aggregate) uncorrected ECC errors tolerated before a WARNING: any volatile
    # uncorrected error is a failure regardless; lifetime history is for trend and RMA.
    ecc_aggregate_uncorrected_max: int = Field(default=0, ge=0)
    # ECC switched off is a WARNING: memory errors go unseen. None: only for the datacenter
    # products in the GPU catalog (workstation cards ship with ECC off by design).
    ecc_required: bool | None = None
    # NVIDIA replaces a GPU whose retired pages reach 60 DBE or 64 total (Volta/Turing
    # page retirement, "NVIDIA GPU Memory Error Management"); we use the total.
    retired_pages_max: int = Field(default=64, ge=1)
    # NVLink error counters are judged as rates between two readings (totals only grow).
    # Per-minute rates above these are NVLINK_ERRORS; recovery means link retraining.
    nvlink_crc_per_min_max: float = Field(default=100.0, ge=0)
    nvlink_replay_per_min_max: float = Field(default=10.0, ge=0)
    nvlink_recovery_per_min_max: float = Field(default=0.0, ge=0)
    # PCIe width every GPU must have (None: the catalog's board width for SXM/HGX products).
    # Below it is PCIE_DEGRADED/FAILED; below the GPU's own maximum otherwise only warns,
    # as a PCIe card may sit in a narrower slot by design.
    pcie_expected_width: int | None = Field(default=None, ge=1, le=32)
    # PCIe generation drops whenever the GPU saves power (also when not flagged idle: a
    # real Blackwell workstation reports gen 1 of 4 with no clock reason), so by default
    # only a narrower width is PCIE_DEGRADED. True: also warn on a lower generation while
    # the GPU is not idle.
    pcie_check_generation_when_busy: bool = False


# --- DCGM (layer-1 GPU work) ---------------------------------------------------------------
class DcgmConfig(StrictModel):
    """DCGM checks (`dcgmi health`, `dcgmi diag`)."""

    # Required: an absent dcgmi is DEPENDENCY_MISSING (fails the node). Optional (default,
    # DCGM is not on every node): absent is reported as CHECK_DISABLED, never a silent pass.
    required: bool = False
    binary: str = "dcgmi"
    health_timeout_s: float = Field(default=30.0, gt=0)
    # `dcgmi diag -r 1` takes seconds, `-r 2` minutes and `-r 3` 30+ minutes; run level 1
    # in the node's diag group and deeper levels from preflight.
    diag_level: int = Field(default=1, ge=1, le=4)
    diag_timeout_s: float = Field(default=600.0, gt=0)
    # How often they run is the agent's schedule (`agent.slow_interval_s`,
    # `agent.diag_interval_s`), the one place intervals are set.


# --- Kernel log, Xid/SXid catalog overrides (layer-1 kernel-log work) ----------------------
class KernelLogConfig(CatalogOverrides):
    """`node.kernel_log`: where the kernel_log check reads, and changes to the Xid catalog.

    The catalog fields (`xid`, `sxid`, `families`, `buckets`, `default_window_s`,
    `boot_noise_window_s`) merge into the shipped `node/catalog/xid.yaml`/`sxid.yaml` per
    code and field; see docs/kernel-log.md.
    """

    # Tried in order until one works; a broken one before it is a SOURCE_FALLBACK warning.
    # /dev/kmsg first: no tool to break and it carries sequence numbers; dmesg next (same
    # ring buffer through util-linux); the journal last (it may lag or be rate-limited).
    sources: tuple[Literal["kmsg", "dmesg", "journal"], ...] = Field(
        default=("kmsg", "dmesg", "journal"), min_length=1
    )
    # Read this file instead of the live sources (a node that ships its kernel log
    # elsewhere, or a test); relative to the check's root.
    file: str | None = None
    # Per tool call: dmesg/journalctl print a few MB at most; 10 s covers a loaded node.
    timeout_s: float = Field(default=10.0, gt=0)
    # Bound on what one read takes in (kmsg, tool output, file tail): the ring buffer is
    # at most a few MB; a 64 MiB bound keeps a runaway journal from exhausting memory.
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=4096)
    # IANA zone of wall-clock stamps printed without an offset (dmesg -T output, syslog's
    # kern.log) in `file`; None: this node's local zone, which is the one that wrote them.
    timezone: str | None = None

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ZoneInfo(v)
            except (ZoneInfoNotFoundError, ValueError) as e:
                raise ValueError(f"unknown time zone {v!r}") from e
        return v

    @model_validator(mode="after")
    def _catalog_builds(self) -> KernelLogConfig:
        try:
            load_catalog(self)
        except ValueError as e:  # CatalogError names the code, e.g. "xid.79: unknown bucket"
            raise ValueError(f"catalog override: {e}") from e
        return self


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
