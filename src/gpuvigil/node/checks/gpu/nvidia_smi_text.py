"""`nvidia-smi -q` (the text form people paste into tickets) -> the same GPU readings.

The text is an indented tree of `Key : Value` lines with one `GPU <bus id>` block per GPU.
It is turned into the XML tree `nvidia-smi -q -x` would have printed (only the elements the
readings use), so one reader (`nvidia_smi.gpu_from_xml`) serves both forms. Handles the
r535+ layout (`Clocks Event Reasons`, split SRAM counters) and older ones (`Clocks
Throttle Reasons`, `Single Bit/Double Bit` ECC trees, `Remapped Rows : N/A` inline), and
nested reasons (HW Thermal / Power Brake under HW Slowdown). A field of any name whose
value is NVML's word for an unreachable GPU (`Product Brand : Unknown Error`, `GPU is
lost`) is kept as `-q -x` keeps it, so the GPU reads as lost. Never raises; a block cut
short shows up as fewer GPUs than `Attached GPUs` (CHECK_ERROR). Called by
`nvidia_smi.parse` and `gpuvigil analyze`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

_LINE = re.compile(r"^(?P<indent> *)(?P<key>[^:]+?)\s*(?::\s*(?P<value>.*?))?\s*$")
_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")

# Text path (section keys and the key, lower case) -> XML path under <gpu>.
_LINK = "pci/pci_gpu_link_info"
_MAP: dict[tuple[str, ...], str] = {
    ("product name",): "product_name",
    ("product architecture",): "product_architecture",
    ("serial number",): "serial",
    ("gpu uuid",): "uuid",
    ("pci", "bus id"): "pci/pci_bus_id",
    ("pci", "gpu link info", "pcie generation", "max"): f"{_LINK}/pcie_gen/max_link_gen",
    ("pci", "gpu link info", "pcie generation", "current"): f"{_LINK}/pcie_gen/current_link_gen",
    ("pci", "gpu link info", "link width", "max"): f"{_LINK}/link_widths/max_link_width",
    ("pci", "gpu link info", "link width", "current"): f"{_LINK}/link_widths/current_link_width",
    ("fb memory usage", "total"): "fb_memory_usage/total",
    ("gpu reset status", "reset required"): "gpu_reset_status/reset_required",
    ("gpu reset status", "drain and reset recommended"): (
        "gpu_reset_status/drain_and_reset_recommended"
    ),
    ("gpu recovery action",): "gpu_recovery_action",
    ("ecc mode", "current"): "ecc_mode/current_ecc",
    ("ecc mode", "pending"): "ecc_mode/pending_ecc",
    ("retired pages", "single bit ecc"): (
        "retired_pages/multiple_single_bit_retirement/retired_count"
    ),
    ("retired pages", "double bit ecc"): "retired_pages/double_bit_retirement/retired_count",
    ("retired pages", "pending page blacklist"): "retired_pages/pending_blacklist",
    ("retired pages", "pending page retirement"): "retired_pages/pending_retirement",
    ("retired pages", "pending"): "retired_pages/pending_retirement",  # older drivers
    ("remapped rows",): "remapped_rows",
    ("remapped rows", "correctable error"): "remapped_rows/remapped_row_corr",
    ("remapped rows", "uncorrectable error"): "remapped_rows/remapped_row_unc",
    ("remapped rows", "pending"): "remapped_rows/remapped_row_pending",
    ("remapped rows", "remapping failure occurred"): "remapped_rows/remapped_row_failure",
    ("temperature", "gpu current temp"): "temperature/gpu_temp",
    ("temperature", "gpu shutdown temp"): "temperature/gpu_temp_max_threshold",
    ("temperature", "gpu slowdown temp"): "temperature/gpu_temp_slow_threshold",
    ("temperature", "memory current temp"): "temperature/memory_temp",
    ("temperature", "memory max operating temp"): "temperature/gpu_temp_max_mem_threshold",
}
for _scope in ("volatile", "aggregate"):
    for _key, _tag in (
        ("sram correctable", "sram_correctable"),
        ("sram uncorrectable", "sram_uncorrectable"),
        ("sram uncorrectable parity", "sram_uncorrectable_parity"),
        ("sram uncorrectable sec-ded", "sram_uncorrectable_secded"),
        ("dram correctable", "dram_correctable"),
        ("dram uncorrectable", "dram_uncorrectable"),
    ):
        _MAP[("ecc errors", _scope, _key)] = f"ecc_errors/{_scope}/{_tag}"
    for _bits, _tag in (("single bit", "single_bit"), ("double bit", "double_bit")):
        _MAP[("ecc errors", _scope, _bits, "total")] = f"ecc_errors/{_scope}/{_tag}/total"

# Clock reasons: matched by the last key anywhere under the reasons section, because the
# HW reasons are printed nested under "HW Slowdown".
_REASON_SECTIONS = {"clocks event reasons": "event", "clocks throttle reasons": "throttle"}
_REASONS = {
    "idle": "gpu_idle",
    "sw power cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown",
    "sw thermal slowdown": "sw_thermal_slowdown",
}


# The values nvidia-smi prints in place of a field when NVML cannot reach the GPU.
_UNREACHABLE = frozenset({"unknown error", "gpu is lost", "gpu requires reset"})


def _set(parent: ET.Element, path: str, value: str) -> None:
    node = parent
    for tag in path.split("/"):
        child = node.find(tag)
        if child is None:
            child = ET.SubElement(node, tag)
        node = child
    if value:
        node.text = value


def looks_like_text(text: str) -> bool:
    return "NVSMI LOG" in text or bool(re.search(r"^Attached GPUs\s*:", text, re.M))


def to_xml(text: str) -> ET.Element:
    """The `nvidia_smi_log` element that `-q -x` would have printed (the parts we read)."""
    root = ET.Element("nvidia_smi_log")
    gpu: ET.Element | None = None
    stack: list[tuple[int, str]] = []  # (indent, lower-case key) of open sections
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        m_gpu = _GPU.match(raw)
        if m_gpu:
            gpu = ET.SubElement(root, "gpu", id=m_gpu.group(1))
            stack = []
            continue
        m = _LINE.match(raw)
        if m is None:
            continue
        indent = len(m.group("indent"))
        key = m.group("key").strip().lower()
        value = (m.group("value") or "").strip()
        if gpu is None:
            if key == "attached gpus":
                _set(root, "attached_gpus", value)
            elif key == "driver version":
                _set(root, "driver_version", value)
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(k for _, k in stack), key)
        reasons = next((_REASON_SECTIONS[k] for _, k in stack if k in _REASON_SECTIONS), None)
        if reasons is not None and key in _REASONS and value:
            tag = f"clocks_{reasons}_reasons/clocks_{reasons}_reason_{_REASONS[key]}"
            _set(gpu, tag, value)
        elif path in _MAP and (value or path == ("remapped rows",)):
            _set(gpu, _MAP[path], value)
        elif value.lower() in _UNREACHABLE:
            _set(gpu, "unreachable/" + re.sub(r"\W+", "_", "_".join(path)).strip("_"), value)
        stack.append((indent, key))
    return root
