"""Health domain `gpu`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

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
)
