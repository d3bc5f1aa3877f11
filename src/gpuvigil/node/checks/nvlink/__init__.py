"""Health domain `nvlink`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="nvlink",
    summary=("NVLink link states and error counters per GPU (NVML, nvidia-smi nvlink)."),
    codes=("NVLINK_DOWN", "NVLINK_ERRORS"),
    formats=(
        Format(
            "nvidia-smi-nvlink",
            "gpu",
            "nvidia-smi nvlink -s",
            read="formats:read_status",
            detect=(Detector(30, "formats:is_status"),),
        ),
    ),
)
