"""GPU memory health: ECC mode and counters, retired pages, remapped rows. Pure.

Called by `rules.gpu.judge_inventory` for NVML and nvidia-smi readings alike. Volatile
counters reset with the driver, so a GPU reset clears ECC_UNCORRECTED_VOLATILE; lifetime
(aggregate) counters never clear and only warn. Row-remap and page-retirement pending
states need a GPU reset; a remap failure or the retired-page limit means replacing the GPU
(NVIDIA, "GPU Memory Error Management", r5xx docs).
"""

from __future__ import annotations

from datetime import datetime

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.gpus import GpuProduct
from gpuvigil.node.checks.gpu.readings import GpuReading
from gpuvigil.node.config import GpuConfig

# The codes `evaluate` emits (the gpu_memory rule declares them; their families are in
# core.codes).
CODES = (
    "ECC_DISABLED",
    "ECC_UNCORRECTED_AGGREGATE",
    "ECC_UNCORRECTED_VOLATILE",
    "RETIRED_PAGES_LIMIT",
    "RETIRED_PAGES_PENDING",
    "ROW_REMAP_FAILURE",
    "ROW_REMAP_PENDING",
)


def evaluate(
    gpu: GpuReading,
    *,
    cfg: GpuConfig,
    product: GpuProduct | None = None,
    now: datetime,
    check: str,
) -> list[Finding]:
    out: list[Finding] = []

    def add(code: str, status: Status, action: Action, message: str, **ev: object) -> None:
        out.append(
            Finding(
                check=check,
                status=status,
                code=code,
                component=gpu.component,
                message=message,
                action=action,
                fatal=action in (Action.REPLACE,),
                evidence={"gpu_uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id, **ev},
                observed_at=now,
            )
        )

    ecc_required = cfg.ecc_required if cfg.ecc_required is not None else product is not None
    if gpu.ecc_enabled is False and ecc_required:
        add(
            "ECC_DISABLED",
            Status.WARNING,
            Action.NONE,
            "ECC is disabled: memory errors are neither corrected nor counted",
            ecc_pending_enabled=gpu.ecc_pending_enabled,
        )
    if (gpu.ecc_volatile_uncorrected or 0) > 0:
        add(
            "ECC_UNCORRECTED_VOLATILE",
            Status.FAILED,
            Action.RESET_GPU,
            f"{gpu.ecc_volatile_uncorrected} uncorrected ECC error(s) since the driver loaded",
            ecc_volatile_uncorrected=gpu.ecc_volatile_uncorrected,
            ecc_volatile_corrected=gpu.ecc_volatile_corrected,
        )
    if (gpu.ecc_aggregate_uncorrected or 0) > cfg.ecc_aggregate_uncorrected_max:
        add(
            "ECC_UNCORRECTED_AGGREGATE",
            Status.WARNING,
            Action.NONE,
            f"{gpu.ecc_aggregate_uncorrected} uncorrected ECC error(s) over the GPU's lifetime",
            ecc_aggregate_uncorrected=gpu.ecc_aggregate_uncorrected,
            threshold=cfg.ecc_aggregate_uncorrected_max,
        )
    if gpu.retired_pending:
        add(
            "RETIRED_PAGES_PENDING",
            Status.FAILED,
            Action.RESET_GPU,
            "pages are pending retirement: reset the GPU to retire them",
            retired_sbe=gpu.retired_sbe,
            retired_dbe=gpu.retired_dbe,
        )
    retired = (gpu.retired_sbe or 0) + (gpu.retired_dbe or 0)
    if retired >= cfg.retired_pages_max:
        add(
            "RETIRED_PAGES_LIMIT",
            Status.FAILED,
            Action.REPLACE,
            f"{retired} retired pages reach the replacement limit of {cfg.retired_pages_max}",
            retired_sbe=gpu.retired_sbe,
            retired_dbe=gpu.retired_dbe,
        )
    if gpu.remap_failure:
        add(
            "ROW_REMAP_FAILURE",
            Status.FAILED,
            Action.REPLACE,
            "a row remap failed (no spare rows): the GPU needs replacing",
            remap_uncorrected=gpu.remap_uncorrected,
            remap_corrected=gpu.remap_corrected,
        )
    elif gpu.remap_pending:
        add(
            "ROW_REMAP_PENDING",
            Status.FAILED,
            Action.RESET_GPU,
            "row remapping is pending: reset the GPU to apply it",
            remap_uncorrected=gpu.remap_uncorrected,
            remap_corrected=gpu.remap_corrected,
        )
    return out
