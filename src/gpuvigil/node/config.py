"""Settings of the layer-1 checks: the `node:` section of the config file.

One sub-model per area, each owned by that area's probe and rules.
"""

from __future__ import annotations

from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from gpuvigil.core.config import StrictModel
from gpuvigil.node.catalog.xid import CatalogOverrides, load_catalog


# --- GPU: NVML, nvidia-smi, thermal/ECC thresholds (layer-1 GPU work) ----------------------
class GpuConfig(StrictModel):
    pass


# --- DCGM (layer-1 GPU work) ---------------------------------------------------------------
class DcgmConfig(StrictModel):
    pass


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
    pass


class NodeConfig(StrictModel):
    expect_gpus: int | None = None  # None: from the instance type, else from what is found
    instance_type: str | None = None  # e.g. p5.48xlarge; None: detected where possible
    gpu: GpuConfig = Field(default_factory=GpuConfig)
    dcgm: DcgmConfig = Field(default_factory=DcgmConfig)
    kernel_log: KernelLogConfig = Field(default_factory=KernelLogConfig)
    fabric: FabricConfig = Field(default_factory=FabricConfig)
