"""PCIe links, current vs maximum. Pure.

Two views of the same links (merged from the layer-1 GPU and fabric work):
- `evaluate(gpu, ...)`: a GPU's link from NVML or nvidia-smi. PCIe generation drops when
  the GPU idles (power saving), so a lower generation only counts while the GPU is busy; a
  narrower link width is always a fault (a bad riser or retimer).
- `judge(reading)`: a sysfs `PcieReading` (GPUs and network adapters) -> PCIE_DEGRADED
  findings; called by the `pcie` check (`node/probes/pcie.py`), `gpuvigil analyze` and the
  simulator.
"""

from __future__ import annotations

from datetime import datetime

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.gpus import GpuProduct
from gpuvigil.node.config import GpuConfig
from gpuvigil.node.readings import CLOCK_GPU_IDLE, GpuReading, PcieLink, PcieReading


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


# --- sysfs view (fabric/preflight work) ---

CHECK = "pcie"


def component(link: PcieLink) -> str:
    return link.name


def judge(reading: PcieReading, *, judge_gpu_speed: bool = False) -> list[Finding]:
    """Width below maximum: always a fault. Speed below maximum: a fault for adapters, and
    for GPUs only when `judge_gpu_speed` (idle GPUs lower their link speed to save power)."""
    out: list[Finding] = []
    now = reading.taken_at
    for problem in reading.problems:
        out.append(
            Finding(
                check=CHECK,
                status=Status.FAILED,
                code="CHECK_ERROR",
                message=problem,
                observed_at=now,
            )
        )
    for link in reading.links:
        ev = {
            "pci_address": link.address,
            "role": link.role,
            "speed_gts": link.speed_gts,
            "max_speed_gts": link.max_speed_gts,
            "width": link.width,
            "max_width": link.max_width,
        }
        comp = component(link)
        for problem in link.problems:
            out.append(
                Finding(
                    check=CHECK,
                    status=Status.FAILED,
                    code="CHECK_ERROR",
                    component=comp,
                    message=problem,
                    evidence=ev,
                    observed_at=now,
                )
            )
        message = _degradation(link, judge_speed=link.role != "gpu" or judge_gpu_speed)
        if message:
            out.append(
                Finding(
                    check=CHECK,
                    status=Status.FAILED,
                    code="PCIE_DEGRADED",
                    component=comp,
                    message=message,
                    action=Action.REBOOT,
                    evidence=ev,
                    observed_at=now,
                )
            )
    return out


def _degradation(link: PcieLink, *, judge_speed: bool) -> str | None:
    where = f"{link.role} {link.address}"
    if link.width == 0:
        return f"{where}: PCIe link is down (width 0)"
    if link.width is not None and link.max_width is not None and link.width < link.max_width:
        return f"{where}: PCIe link runs x{link.width}, maximum x{link.max_width}"
    if link.speed_gts is None and link.max_speed_gts is not None and not link.problems:
        if judge_speed:
            return f"{where}: PCIe link speed is Unknown (link down)"
        return None
    if (
        judge_speed
        and link.speed_gts is not None
        and link.max_speed_gts is not None
        and link.speed_gts < link.max_speed_gts
    ):
        return (
            f"{where}: PCIe link runs at {link.speed_gts:g} GT/s, "
            f"maximum {link.max_speed_gts:g} GT/s"
        )
    return None
