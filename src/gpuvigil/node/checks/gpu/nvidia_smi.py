"""`nvidia-smi -q -x` -> the same GPU readings as NVML: the fallback when NVML is unusable
from Python, and the input of `gpuvigil analyze --nvidia-smi-xml`.

Handles the DTD versions seen in the field (v10-v13: `clocks_throttle_reasons` and
`clocks_event_reasons`, `single_bit/double_bit` and `sram_/dram_` ECC trees, split SRAM
parity/SECDED counters, scalar `<remapped_rows>N/A</remapped_rows>`, relative "tlimit"
thresholds), "Unable to determine the device handle" lines printed before the XML for a
lost GPU, and output cut short. `parse_xml` never raises: what it cannot read becomes a
`ReadError` on the inventory, which the rules turn into CHECK_ERROR.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime

from gpuvigil.core.findings import Finding, utcnow
from gpuvigil.io import exec as ex
from gpuvigil.node.catalog import gpus as gpu_catalog
from gpuvigil.node.catalog import phrases
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.gpu import nvidia_smi_errors, nvidia_smi_text
from gpuvigil.node.checks.gpu.readings import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_POWER_CAP,
    CLOCK_SW_THERMAL,
    GpuInventory,
    GpuReading,
    ReadError,
)

ARGV = ("nvidia-smi", "-q", "-x")
_NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
_LOST_TEXT = ("gpu is lost", "unknown error", "gpu requires reset")
# nvidia-smi clock-reason names -> NVML bits (XML, `-q` text and CSV alike).
REASON_BITS = {
    "gpu_idle": CLOCK_GPU_IDLE,
    "sw_power_cap": CLOCK_SW_POWER_CAP,
    "hw_slowdown": CLOCK_HW_SLOWDOWN,
    "sw_thermal_slowdown": CLOCK_SW_THERMAL,
    "hw_thermal_slowdown": CLOCK_HW_THERMAL,
    "hw_power_brake_slowdown": CLOCK_HW_POWER_BRAKE,
}


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    node = el.find(path)
    if node is None or node.text is None:
        return None
    value = node.text.strip()
    return None if value in {"", "N/A", "[N/A]"} or value.startswith("Requested func") else value


def _num(el: ET.Element | None, path: str) -> float | None:
    value = _text(el, path)
    m = _NUM.match(value) if value else None
    return float(m.group(1)) if m else None


def _int(el: ET.Element | None, path: str) -> int | None:
    value = _num(el, path)
    return int(value) if value is not None else None


def _yes(el: ET.Element | None, path: str) -> bool | None:
    value = _text(el, path)
    if value is None:
        return None
    low = value.lower()
    if low in {"yes", "enabled", "active"}:
        return True
    if low in {"no", "disabled", "not active"}:
        return False
    return None


def _sum(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc(scope: ET.Element | None) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) of one ECC scope, across the DTD generations."""
    if scope is None:
        return None, None
    if scope.find("single_bit") is not None or scope.find("double_bit") is not None:
        return _int(scope, "single_bit/total"), _int(scope, "double_bit/total")
    corrected = _sum(_int(scope, "dram_correctable"), _int(scope, "sram_correctable"))
    uncorrected = _sum(
        _int(scope, "dram_uncorrectable"),
        _int(scope, "sram_uncorrectable"),
        _int(scope, "sram_uncorrectable_parity"),
        _int(scope, "sram_uncorrectable_secded"),
    )
    return corrected, uncorrected


def _clock_reasons(gpu: ET.Element) -> int | None:
    block = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if block is None:
        block, prefix = gpu.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    if block is None:
        return None
    mask, seen = 0, False
    for name, bit in REASON_BITS.items():
        state = _yes(block, prefix + name)
        seen = seen or state is not None
        if state:
            mask |= bit
    return mask if seen else None


def _recovery_action(gpu: ET.Element) -> str | None:
    """`gpu_recovery_action` (r570+: "None", "Reset", "Reboot", "Drain P2P", "Drain and
    Reset", ...), else the older `gpu_reset_status` Yes/No pair."""
    text = _text(gpu, "gpu_recovery_action")
    if text:
        return recovery_action_of(text)
    drain = _yes(gpu, "gpu_reset_status/drain_and_reset_recommended")
    reset = _yes(gpu, "gpu_reset_status/reset_required")
    if drain:
        return "DRAIN_AND_RESET"
    if reset:
        return "GPU_RESET"
    return "NONE" if drain is False or reset is False else None


def recovery_action_of(text: str) -> str:
    """nvidia-smi's recovery action words ("None", "Reset", "Reboot", "Drain P2P", "Drain
    and Reset", ...) -> NVML's names (GpuReading.recovery_action)."""
    low = text.lower()
    for needle, action in (
        ("none", "NONE"),
        ("drain and reset", "DRAIN_AND_RESET"),
        ("p2p", "DRAIN_P2P"),
        ("imex", "RECOVER_IMEX_DOMAIN"),
        ("bus", "BUS_RESET"),
        ("system", "SYSTEM_REBOOT"),
        ("reboot", "NODE_REBOOT"),
        ("reset", "GPU_RESET"),
    ):
        if needle in low:
            return action
    return f"UNKNOWN_{text.upper().replace(' ', '_')}"


def _threshold(temp: ET.Element | None, name: str) -> float | None:
    return _num(temp, name)  # absolute thresholds only; "*_tlimit_*" names are relative


def gpu_from_xml(index: int, gpu: ET.Element) -> GpuReading:
    name = _text(gpu, "product_name")
    texts = " ".join((el.text or "") for el in gpu.iter() if el.text).lower()
    lost = any(t in texts for t in _LOST_TEXT)
    ecc_vol = _ecc(gpu.find("ecc_errors/volatile"))
    ecc_agg = _ecc(gpu.find("ecc_errors/aggregate"))
    temp = gpu.find("temperature")
    link = gpu.find("pci/pci_gpu_link_info")
    product = gpu_catalog.load().lookup(name)
    pending = _yes(gpu, "retired_pages/pending_retirement")
    if pending is None:
        pending = _yes(gpu, "retired_pages/pending_blacklist")
    bus = _text(gpu, "pci/pci_bus_id") or gpu.get("id")
    return GpuReading(
        index=index,
        name=name,
        uuid=_text(gpu, "uuid"),
        serial=_text(gpu, "serial"),
        pci_bus_id=bus.upper() if bus else None,
        architecture=_arch(_text(gpu, "product_architecture"), product),
        memory_total_mib=_int(gpu, "fb_memory_usage/total"),
        ecc_enabled=_yes(gpu, "ecc_mode/current_ecc"),
        ecc_pending_enabled=_yes(gpu, "ecc_mode/pending_ecc"),
        ecc_volatile_corrected=ecc_vol[0],
        ecc_volatile_uncorrected=ecc_vol[1],
        ecc_aggregate_corrected=ecc_agg[0],
        ecc_aggregate_uncorrected=ecc_agg[1],
        retired_sbe=_int(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
        retired_dbe=_int(gpu, "retired_pages/double_bit_retirement/retired_count"),
        retired_pending=pending,
        remap_corrected=_int(gpu, "remapped_rows/remapped_row_corr"),
        remap_uncorrected=_int(gpu, "remapped_rows/remapped_row_unc"),
        remap_pending=_yes(gpu, "remapped_rows/remapped_row_pending"),
        remap_failure=_yes(gpu, "remapped_rows/remapped_row_failure"),
        temperature_gpu_c=_num(temp, "gpu_temp"),
        temperature_memory_c=_num(temp, "memory_temp"),
        slowdown_temp_c=_threshold(temp, "gpu_temp_slow_threshold"),
        shutdown_temp_c=_threshold(temp, "gpu_temp_max_threshold"),
        memory_max_temp_c=_threshold(temp, "gpu_temp_max_mem_threshold"),
        clock_event_reasons=_clock_reasons(gpu),
        pcie_gen=_int(link, "pcie_gen/current_link_gen"),
        pcie_gen_max=_int(link, "pcie_gen/max_link_gen"),
        pcie_width=_int(link, "link_widths/current_link_width"),
        pcie_width_max=_int(link, "link_widths/max_link_width"),
        recovery_action=_recovery_action(gpu),
        lost=lost,
        errors=(ReadError("gpu", "Unknown", "nvidia-smi reports an error for this GPU"),)
        if lost
        else (),
    )


def _arch(text: str | None, product: gpu_catalog.GpuProduct | None) -> str | None:
    """NVML's family names ("Ada Lovelace" -> "Ada"), else the catalog's."""
    if text:
        return text.split()[0]
    return product.family if product else None


def parse_xml(text: str | bytes, *, observed_at: datetime | None = None) -> GpuInventory:
    """`nvidia-smi -q -x` output (or the `-q` text form). Never raises: unreadable or cut
    output yields an inventory with `errors`."""
    observed_at = observed_at or utcnow()
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    errors: list[ReadError] = []
    said = nvidia_smi_errors.scan(text)
    lost = list(said.lost)
    marks = (text.find("<?xml"), text.find("<nvidia_smi_log"))
    start = min((i for i in marks if i >= 0), default=-1)
    root = None
    if start < 0 and nvidia_smi_text.looks_like_text(text):
        try:
            root = nvidia_smi_text.to_xml(text)  # `nvidia-smi -q` text, pasted
        except Exception as e:  # noqa: BLE001 - never raise on input
            errors.append(ReadError("text", "Unparsable", f"{type(e).__name__}: {e}"))
    elif start < 0 and said.driver is not None:
        errors.append(said.driver)  # the driver is unusable: DRIVER_UNAVAILABLE
    elif start < 0 and said.no_devices:
        # The driver runs and sees no GPU: a count of zero, judged against the expected one.
        return GpuInventory(source="nvidia-smi", observed_at=observed_at, count=0)
    elif start < 0 and lost:
        errors.append(
            ReadError(
                "gpu", "Incomplete", "nvidia-smi stopped at the lost GPU: the others are unknown"
            )
        )
    elif start < 0:
        errors.append(ReadError("xml", "Unparsable", "no nvidia_smi_log document in the output"))
    else:
        try:
            root = ET.fromstring(text[start:])
        except ET.ParseError as e:
            errors.append(ReadError("xml", "Unparsable", f"output does not parse: {e}"))
        except Exception as e:  # noqa: BLE001 - expat limits, recursion: never raise
            errors.append(ReadError("xml", "Unparsable", f"{type(e).__name__}: {e}"))
    gpus: list[GpuReading] = []
    attached: int | None = None
    driver: str | None = None
    if root is not None:
        if root.tag != "nvidia_smi_log":
            errors.append(ReadError("xml", "Unparsable", f"root element is <{root.tag}>"))
        attached = _int(root, "attached_gpus")
        driver = _text(root, "driver_version")
        for i, el in enumerate(root.findall("gpu")):
            try:
                gpus.append(gpu_from_xml(i, el))
            except Exception as e:  # noqa: BLE001 - one odd GPU block must not hide the rest
                errors.append(ReadError(f"gpu[{i}]", "Unparsable", f"{type(e).__name__}: {e}"))
    known = {g.pci_bus_id for g in gpus}
    gpus += [g for g in lost if g.pci_bus_id not in known]
    # GPU indexes follow PCI bus order (NVML's and nvidia-smi's default enumeration), so a
    # GPU that nvidia-smi could not reach keeps its place and the others keep their index.
    if all(g.pci_bus_id for g in gpus):
        gpus.sort(key=lambda g: g.pci_bus_id or "")
    gpus = [replace(g, index=i) for i, g in enumerate(gpus)]
    if attached is not None and len(gpus) < attached:
        errors.append(
            ReadError(
                "gpu",
                "Incomplete",
                f"nvidia-smi says {attached} GPU(s) are attached but describes {len(gpus)}",
            )
        )
    return GpuInventory(
        source="nvidia-smi",
        observed_at=observed_at,
        gpus=tuple(gpus),
        count=attached if attached is not None else len(gpus) if root is not None else None,
        driver_version=driver,
        errors=tuple(errors),
    )


# --- Running it ----------------------------------------------------------------------------
def collect(ctx: CheckContext, *, timeout_s: float) -> tuple[GpuInventory | None, Finding | None]:
    """Run `nvidia-smi -q -x` fail-closed: (inventory, None) or (None, failure finding)."""
    inv, failure, _ = _run(ctx, timeout_s=timeout_s)
    return inv, failure


def _run(ctx: CheckContext, *, timeout_s: float) -> tuple[GpuInventory | None, Finding | None, str]:
    """`collect`, and the text nvidia-smi printed (stdout and stderr, decoded)."""
    result = ex.run(ARGV, timeout_s=timeout_s, env=ctx.env)
    failure = ex.failure_finding(result, check="gpu", what="nvidia-smi")
    both = result.stdout + b"\n" + result.stderr  # nvidia-smi prints its errors on stdout
    text = both.decode("utf-8", errors="replace")
    if failure is not None:
        # nvidia-smi exits non-zero when one GPU is lost but still prints the others, and
        # when it has something definite to say (lost GPU, no driver, no devices); a run
        # killed by a signal or cut at the output bound is no reading at all.
        # Read then by the reader `analyze` uses for the same text (`parse_xml`, which
        # knows nvidia-smi's error answers): a version mismatch or "No devices were found"
        # is what it says (DRIVER_UNAVAILABLE, GPU_COUNT_LOW), not a tool that broke.
        said = nvidia_smi_errors.scan(text)
        definite = said.lost or said.driver is not None or said.no_devices
        if result.exited and (b"<nvidia_smi_log" in result.stdout or definite):
            return parse_xml(both), None, text
        return None, failure, text
    inv = parse_xml(both)
    if not inv.gpus and inv.errors:
        problem = inv.errors[0].message
        return None, ex.unparsable_finding(result, check="gpu", problem=problem), text
    return inv, None, text


def fallback_inventory(
    ctx: CheckContext,
) -> tuple[GpuInventory | None, str, tuple[phrases.Hit, ...]]:
    """NVML is unusable: the GPUs as nvidia-smi sees them, or None and why it failed too,
    and the catalog's error phrases in what nvidia-smi printed. The `gpu` check records
    which source stood in (`GpuSource`, with those phrases); the rules judge the GPUs, and
    a phrase no rule explained is ERROR_TEXT, as `analyze` makes of the same text."""
    inv, failure, text = _run(ctx, timeout_s=ctx.config.gpu.nvidia_smi_timeout_s)
    said = tuple(phrases.hits_in_text(text))
    if inv is None:
        assert failure is not None
        return None, f"nvidia-smi fallback failed too ({failure.code}: {failure.message})", said
    return inv, "judged from nvidia-smi instead", said
