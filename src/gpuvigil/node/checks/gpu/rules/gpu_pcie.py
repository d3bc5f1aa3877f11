"""A GPU's PCIe link as NVML or nvidia-smi report it, current vs required/maximum. Pure.

Width below the board's width (SXM/HGX: x16) fails; below the card's own maximum only
warns (a PCIe card may sit in a narrower slot by design). Generation drops with power
saving, so it is judged only when configured, while the GPU is not idle. The sysfs view
of the same links and of network adapters is `rules.pcie` (fabric work).
"""

from __future__ import annotations

from datetime import datetime

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.gpus import GpuProduct
from gpuvigil.node.checks.gpu.readings import CLOCK_GPU_IDLE, GpuReading
from gpuvigil.node.config import GpuConfig


def evaluate(
    gpu: GpuReading,
    *,
    cfg: GpuConfig,
    product: GpuProduct | None = None,
    now: datetime,
    check: str,
) -> list[Finding]:
    problems = []
    required = cfg.pcie_expected_width or (product.board_pcie_width if product else None)
    width, width_max = gpu.pcie_width, gpu.pcie_width_max
    narrow = width is not None and required is not None and width < required
    if narrow:
        problems.append(f"width x{width}, x{required} required")
    elif width is not None and width_max and width < width_max:
        problems.append(f"width x{width} of x{width_max} (the slot may be narrower by design)")
    busy = gpu.clock_event_reasons is not None and not gpu.clock_event_reasons & CLOCK_GPU_IDLE
    if (
        cfg.pcie_check_generation_when_busy
        and busy
        and gpu.pcie_gen is not None
        and gpu.pcie_gen_max
        and gpu.pcie_gen < gpu.pcie_gen_max
    ):
        problems.append(f"generation {gpu.pcie_gen} of {gpu.pcie_gen_max} while busy")
    if not problems:
        return []
    # Below the board's width cuts host and GPUDirect bandwidth for good: failed. Below the
    # card's maximum, or a slow generation while busy, may be by design or transient.
    return [
        Finding(
            check=check,
            status=Status.FAILED if narrow else Status.WARNING,
            code="PCIE_DEGRADED",
            component=gpu.component,
            message="PCIe link degraded: " + ", ".join(problems),
            action=Action.REBOOT if narrow else Action.NONE,
            evidence={
                "gpu_uuid": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "pcie_gen": gpu.pcie_gen,
                "pcie_gen_max": gpu.pcie_gen_max,
                "pcie_width": gpu.pcie_width,
                "pcie_width_max": gpu.pcie_width_max,
                "pcie_width_required": required,
            },
            observed_at=now,
        )
    ]
