"""Health domain `gpu`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="gpu",
    summary=(
        "The GPUs as NVML and nvidia-smi see them: presence, memory, thermal and power, the "
        "links each GPU reports."
    ),
    codes=(
        "GPU_COUNT_LOW",
        "GPU_LOST",
        "GPU_RECOVERY_REQUIRED",
        "SOURCE_FALLBACK",
        "ECC_UNCORRECTED_VOLATILE",
        "ECC_UNCORRECTED_AGGREGATE",
        "ECC_DISABLED",
        "RETIRED_PAGES_PENDING",
        "RETIRED_PAGES_LIMIT",
        "ROW_REMAP_PENDING",
        "ROW_REMAP_FAILURE",
        "THERMAL_SLOWDOWN",
        "HW_SLOWDOWN",
        "POWER_BRAKE",
        "TEMPERATURE_HIGH",
    ),
    also_emits=("NVLINK_DOWN", "NVLINK_ERRORS", "PCIE_DEGRADED"),
    formats=(
        Format(
            "nvidia-smi-xml",
            "gpu",
            "nvidia-smi -q -x",
            read="formats:read_xml",
            detect=(Detector(20, "formats:is_xml"),),
        ),
        Format(
            "nvidia-smi-q",
            "gpu",
            "nvidia-smi -q [-d ...] (text)",
            read="formats:read_q",
            detect=(Detector(21, "formats:is_q"), Detector(46, "formats:is_q_excerpt")),
        ),
        Format(
            "nvidia-smi-csv",
            "gpu",
            "nvidia-smi --query-gpu=... --format=csv",
            read="formats:read_csv",
            detect=(Detector(50, "formats:is_csv"),),
        ),
        Format(
            "nvidia-smi-error",
            "gpu",
            "nvidia-smi's error answer",
            read="formats:read_xml",
            detect=(Detector(51, "formats:is_error"),),
        ),
        Format(
            "nvidia-smi-table",
            "gpu",
            "nvidia-smi (the plain table)",
            read="formats:read_table",
            detect=(Detector(41, "formats:is_table"),),
        ),
    ),
    fake="fake:readings",
)
