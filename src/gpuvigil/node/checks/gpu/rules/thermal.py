"""GPU thermal and power state: clock-event reasons and temperatures. Pure.

Hardware slowdown is the parent reason: when the hardware asserts it because of the power
brake or a thermal trip, the specific code (POWER_BRAKE, THERMAL_SLOWDOWN) is reported
instead of a second, vaguer one. Hardware-asserted slowdowns fail the node for gang work
(one slow GPU paces every rank); a software thermal cap and high temperatures warn.
"""

from __future__ import annotations

from datetime import datetime

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.catalog.gpus import GpuProduct
from gpuvigil.node.checks.gpu.readings import (
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_THERMAL,
    GpuReading,
)
from gpuvigil.node.config import GpuConfig

# The codes `evaluate` emits (the gpu_thermal rule declares them; their families are in
# core.codes).
CODES = ("HW_SLOWDOWN", "POWER_BRAKE", "TEMPERATURE_HIGH", "THERMAL_SLOWDOWN")


def evaluate(
    gpu: GpuReading,
    *,
    cfg: GpuConfig,
    product: GpuProduct | None,
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
                evidence={"gpu_uuid": gpu.uuid, **ev},
                observed_at=now,
            )
        )

    reasons = gpu.clock_event_reasons or 0
    ev = {"clock_event_reasons": hex(reasons), "temperature_gpu_c": gpu.temperature_gpu_c}
    if reasons & CLOCK_HW_POWER_BRAKE:
        add(
            "POWER_BRAKE",
            Status.FAILED,
            Action.INVESTIGATE,
            "hardware power brake slowdown is active (external power-brake signal)",
            **ev,
        )
    if reasons & CLOCK_HW_THERMAL:
        add(
            "THERMAL_SLOWDOWN",
            Status.FAILED,
            Action.INVESTIGATE,
            "hardware thermal slowdown is active",
            **ev,
        )
    elif reasons & CLOCK_SW_THERMAL:
        add(
            "THERMAL_SLOWDOWN",
            Status.WARNING,
            Action.NONE,
            "software thermal slowdown is active (clocks capped for temperature)",
            **ev,
        )
    if reasons & CLOCK_HW_SLOWDOWN and not reasons & (CLOCK_HW_POWER_BRAKE | CLOCK_HW_THERMAL):
        add(
            "HW_SLOWDOWN",
            Status.FAILED,
            Action.INVESTIGATE,
            "hardware slowdown is active (clocks cut by half or more)",
            **ev,
        )
    gpu_max = _limit(cfg.gpu_temperature_max_c, gpu.slowdown_temp_c, cfg, product, "gpu")
    temp = gpu.temperature_gpu_c
    if temp is not None and gpu_max is not None and temp > gpu_max:
        add(
            "TEMPERATURE_HIGH",
            Status.WARNING,
            Action.NONE,
            f"GPU at {temp:g} C, above {gpu_max:g} C",
            sensor="gpu",
            limit_c=gpu_max,
        )
    mem_max = _limit(cfg.memory_temperature_max_c, gpu.memory_max_temp_c, cfg, product, "memory")
    mem = gpu.temperature_memory_c
    if mem is not None and mem_max is not None and mem > mem_max:
        add(
            "TEMPERATURE_HIGH",
            Status.WARNING,
            Action.NONE,
            f"GPU memory at {mem:g} C, above {mem_max:g} C",
            sensor="memory",
            temperature_memory_c=mem,
            limit_c=mem_max,
        )
    return out


def _limit(
    configured: float | None,
    reported: float | None,
    cfg: GpuConfig,
    product: GpuProduct | None,
    sensor: str,
) -> float | None:
    """Config first; else the GPU's own threshold minus the margin (ignoring the small or
    negative relative "T.Limit" values some drivers report); else the catalog."""
    if configured is not None:
        return configured
    if reported is not None and reported >= 60:
        return reported - cfg.temperature_margin_c
    if product is not None:
        return product.gpu_max_c if sensor == "gpu" else product.memory_max_c
    return None
