"""Pure rules: a PcieReading -> PCIE_DEGRADED findings (current vs maximum link).

Registered as the `pcie` rule: `node.pipeline` feeds it for the `pcie` check
(`node/checks/pcie/pcie.py`), `gpuvigil analyze` and the simulator.
"""

from __future__ import annotations

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.checks.pcie.readings import PcieLink, PcieReading
from gpuvigil.node.pipeline.registry import Inputs, rule

CHECK = "pcie"


def component(link: PcieLink) -> str:
    return link.name


@rule("pcie", reads=PcieReading, codes=("PCIE_DEGRADED",))
def pcie_rule(reading: PcieReading, on: Inputs) -> list[Finding]:
    """PCIe links of GPUs and network adapters: current against maximum speed and width."""
    fabric = getattr(on.config, "fabric", None)
    return judge(reading, judge_gpu_speed=bool(getattr(fabric, "pcie_judge_gpu_speed", False)))


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
