"""Render a FakeNode as `nvidia-smi -q -x` output (DTD v12 layout, driver 535-era names).

Used by the tests (a fake `nvidia-smi` binary that prints this), the simulator and the
example bundle. Lost GPUs are left out of the XML and reported the way nvidia-smi does,
as "Unable to determine the device handle" lines (`lost_lines`).
"""

from __future__ import annotations

from xml.sax.saxutils import escape

from gpuvigil.fakes.gpu import (
    CLOCK_GPU_IDLE,
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    CLOCK_SW_POWER_CAP,
    CLOCK_SW_THERMAL,
    FakeGpu,
    FakeNode,
)

_ARCH = {5: "Volta", 7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell"}
_REASONS = (
    ("gpu_idle", CLOCK_GPU_IDLE),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", CLOCK_SW_POWER_CAP),
    ("hw_slowdown", CLOCK_HW_SLOWDOWN),
    ("hw_thermal_slowdown", CLOCK_HW_THERMAL),
    ("hw_power_brake_slowdown", CLOCK_HW_POWER_BRAKE),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", CLOCK_SW_THERMAL),
    ("display_clocks_setting", 0x100),
)


def _yn(flag: bool) -> str:
    return "Yes" if flag else "No"


def _gpu_xml(g: FakeGpu) -> str:
    ecc_state = "Enabled" if g.ecc_enabled else "Disabled"
    na = "N/A"

    def ecc(scope: str) -> str:
        if not (g.ecc_supported and g.ecc_enabled):
            vals = dict.fromkeys(("c", "u"), na)
        else:
            vals = {
                "c": str(getattr(g, f"ecc_{scope}_corrected")),
                "u": str(getattr(g, f"ecc_{scope}_uncorrected")),
            }
        zero = "0" if vals["c"] != na else na
        return (
            f"\t\t\t<{scope}>\n"
            f"\t\t\t\t<sram_correctable>{zero}</sram_correctable>\n"
            f"\t\t\t\t<sram_uncorrectable>{zero}</sram_uncorrectable>\n"
            f"\t\t\t\t<dram_correctable>{vals['c']}</dram_correctable>\n"
            f"\t\t\t\t<dram_uncorrectable>{vals['u']}</dram_uncorrectable>\n"
            f"\t\t\t</{scope}>\n"
        )

    if g.retired_pages_supported:
        retired = (
            f"\t\t\t<multiple_single_bit_retirement>\n\t\t\t\t<retired_count>{len(g.retired_sbe)}"
            "</retired_count>\n\t\t\t\t<retired_pagelist>\n\t\t\t\t</retired_pagelist>\n"
            "\t\t\t</multiple_single_bit_retirement>\n"
            f"\t\t\t<double_bit_retirement>\n\t\t\t\t<retired_count>{len(g.retired_dbe)}"
            "</retired_count>\n\t\t\t\t<retired_pagelist>\n\t\t\t\t</retired_pagelist>\n"
            "\t\t\t</double_bit_retirement>\n"
            f"\t\t\t<pending_blacklist>{_yn(g.retired_pending)}</pending_blacklist>\n"
            f"\t\t\t<pending_retirement>{_yn(g.retired_pending)}</pending_retirement>\n"
        )
    else:
        retired = (
            "\t\t\t<multiple_single_bit_retirement>\n\t\t\t\t<retired_count>N/A</retired_count>\n"
            "\t\t\t\t<retired_pagelist>N/A</retired_pagelist>\n"
            "\t\t\t</multiple_single_bit_retirement>\n"
            "\t\t\t<double_bit_retirement>\n\t\t\t\t<retired_count>N/A</retired_count>\n"
            "\t\t\t\t<retired_pagelist>N/A</retired_pagelist>\n\t\t\t</double_bit_retirement>\n"
            "\t\t\t<pending_blacklist>N/A</pending_blacklist>\n"
            "\t\t\t<pending_retirement>N/A</pending_retirement>\n"
        )
    if g.remap_supported:
        remapped = (
            "\t\t<remapped_rows>\n"
            f"\t\t\t<remapped_row_corr>{g.remap_corrected}</remapped_row_corr>\n"
            f"\t\t\t<remapped_row_unc>{g.remap_uncorrected}</remapped_row_unc>\n"
            f"\t\t\t<remapped_row_pending>{_yn(g.remap_pending)}</remapped_row_pending>\n"
            f"\t\t\t<remapped_row_failure>{_yn(g.remap_failure)}</remapped_row_failure>\n"
            "\t\t</remapped_rows>\n"
        )
    else:
        remapped = "\t\t<remapped_rows>N/A</remapped_rows>\n"
    reasons = "".join(
        f"\t\t\t<clocks_event_reason_{name}>"
        f"{'Active' if g.clock_event_reasons & bit else 'Not Active'}"
        f"</clocks_event_reason_{name}>\n"
        for name, bit in _REASONS
    )
    bus = g.pci_bus_id
    return (
        f'\t<gpu id="{escape(bus)}">\n'
        f"\t\t<product_name>{escape(g.name)}</product_name>\n"
        f"\t\t<product_brand>NVIDIA</product_brand>\n"
        f"\t\t<product_architecture>{_ARCH.get(g.architecture, 'Unknown')}"
        "</product_architecture>\n"
        f"\t\t<serial>{escape(g.serial)}</serial>\n"
        f"\t\t<uuid>{escape(g.uuid)}</uuid>\n"
        f"\t\t<minor_number>{g.index}</minor_number>\n"
        "\t\t<gpu_reset_status>\n"
        f"\t\t\t<reset_required>{_yn(g.recovery_action in (1, 2))}</reset_required>\n"
        f"\t\t\t<drain_and_reset_recommended>{_yn(g.recovery_action == 4)}"
        "</drain_and_reset_recommended>\n"
        "\t\t</gpu_reset_status>\n"
        "\t\t<pci>\n"
        f"\t\t\t<pci_bus>{bus.split(':')[1]}</pci_bus>\n"
        f"\t\t\t<pci_bus_id>{escape(bus)}</pci_bus_id>\n"
        "\t\t\t<pci_gpu_link_info>\n\t\t\t\t<pcie_gen>\n"
        f"\t\t\t\t\t<max_link_gen>{g.pcie_gen_max}</max_link_gen>\n"
        f"\t\t\t\t\t<current_link_gen>{g.pcie_gen}</current_link_gen>\n"
        f"\t\t\t\t\t<device_current_link_gen>{g.pcie_gen}</device_current_link_gen>\n"
        f"\t\t\t\t\t<max_device_link_gen>{g.pcie_gen_max}</max_device_link_gen>\n"
        f"\t\t\t\t\t<max_host_link_gen>{g.pcie_gen_max}</max_host_link_gen>\n"
        "\t\t\t\t</pcie_gen>\n\t\t\t\t<link_widths>\n"
        f"\t\t\t\t\t<max_link_width>{g.pcie_width_max}x</max_link_width>\n"
        f"\t\t\t\t\t<current_link_width>{g.pcie_width}x</current_link_width>\n"
        "\t\t\t\t</link_widths>\n\t\t\t</pci_gpu_link_info>\n"
        "\t\t</pci>\n"
        f"\t\t<clocks_event_reasons>\n{reasons}\t\t</clocks_event_reasons>\n"
        "\t\t<fb_memory_usage>\n"
        f"\t\t\t<total>{g.memory_total_mib} MiB</total>\n"
        "\t\t\t<reserved>0 MiB</reserved>\n\t\t\t<used>0 MiB</used>\n"
        f"\t\t\t<free>{g.memory_total_mib} MiB</free>\n"
        "\t\t</fb_memory_usage>\n"
        "\t\t<ecc_mode>\n"
        f"\t\t\t<current_ecc>{ecc_state if g.ecc_supported else na}</current_ecc>\n"
        f"\t\t\t<pending_ecc>{ecc_state if g.ecc_supported else na}</pending_ecc>\n"
        "\t\t</ecc_mode>\n"
        f"\t\t<ecc_errors>\n{ecc('volatile')}{ecc('aggregate')}\t\t</ecc_errors>\n"
        f"\t\t<retired_pages>\n{retired}\t\t</retired_pages>\n"
        f"{remapped}"
        "\t\t<temperature>\n"
        f"\t\t\t<gpu_temp>{g.temperature_gpu_c} C</gpu_temp>\n"
        f"\t\t\t<gpu_temp_max_threshold>{g.shutdown_threshold_c} C</gpu_temp_max_threshold>\n"
        f"\t\t\t<gpu_temp_slow_threshold>{g.slowdown_threshold_c} C</gpu_temp_slow_threshold>\n"
        f"\t\t\t<gpu_temp_max_gpu_threshold>{g.slowdown_threshold_c - 3} C"
        "</gpu_temp_max_gpu_threshold>\n"
        "\t\t\t<gpu_target_temperature>N/A</gpu_target_temperature>\n"
        f"\t\t\t<memory_temp>{g.temperature_memory_c} C</memory_temp>\n"
        f"\t\t\t<gpu_temp_max_mem_threshold>{g.memory_max_threshold_c} C"
        "</gpu_temp_max_mem_threshold>\n"
        "\t\t</temperature>\n"
        "\t</gpu>\n"
    )


def render_xml(node: FakeNode, *, timestamp: str = "Mon Nov 30 07:00:00 2026") -> str:
    """The XML document nvidia-smi prints for `node` (lost GPUs omitted, as it does)."""
    present = [g for g in node.gpus if g.present]
    body = "".join(_gpu_xml(g) for g in present if not g.lost)
    cuda = "12.4"
    return (
        '<?xml version="1.0" ?>\n'
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        "<nvidia_smi_log>\n"
        f"\t<timestamp>{timestamp}</timestamp>\n"
        f"\t<driver_version>{escape(node.driver_version)}</driver_version>\n"
        f"\t<cuda_version>{cuda}</cuda_version>\n"
        f"\t<attached_gpus>{len(present)}</attached_gpus>\n"
        f"{body}"
        "</nvidia_smi_log>\n"
    )


def lost_lines(node: FakeNode) -> str:
    """What nvidia-smi prints for GPUs it cannot reach (before the XML)."""
    return "".join(
        f"Unable to determine the device handle for GPU {g.pci_bus_id[4:]}: Unknown Error\n"
        for g in node.gpus
        if g.present and g.lost
    )
