"""What each GPU reported through NVML in the middle of the sustained load: clock-event
(throttle) reasons, SM clock, temperature, power. Evidence for a GPU_SLOW verdict (a GPU
that throttles only under load looks healthy to status checks at rest).

Runs in the worker, inside the load check's deadline; any NVML failure is reported as
evidence ("unavailable: ..."), never raised. Called by `matmul.load`.
"""

from __future__ import annotations

from typing import Any

# nvmlClocksEventReason* bits (NVML's nvml.h; formerly nvmlClocksThrottleReason*).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
SLOWING = {
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_power_cap",
}


def decode(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def sample(pci_addresses: list[str | None]) -> dict[int, dict[str, Any]]:
    """{device index: readings} for the devices whose PCI address NVML knows."""
    try:
        import pynvml
    except ImportError as e:
        return {i: {"nvml": f"unavailable: {e}"} for i in range(len(pci_addresses))}
    out: dict[int, dict[str, Any]] = {}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_* or a broken binding: evidence only
        return {i: {"nvml": f"unavailable: {e}"} for i in range(len(pci_addresses))}
    try:
        for i, pci in enumerate(pci_addresses):
            if not pci:
                continue
            try:
                h = pynvml.nvmlDeviceGetHandleByPciBusId(pci.encode())
                get_reasons = (
                    getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
                )
                mask = int(get_reasons(h))
                out[i] = {
                    "clock_event_reasons": decode(mask),
                    "sm_clock_mhz": int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                    "temperature_c": int(
                        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                    ),
                    "power_w": round(pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0, 1),
                }
            except Exception as e:  # noqa: BLE001 - one GPU's NVML error is its evidence
                out[i] = {"nvml": f"error: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass
    return out
