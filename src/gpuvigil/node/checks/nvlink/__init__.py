"""Health domain `nvlink`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="nvlink",
    summary=("NVLink link states and error counters per GPU (NVML, nvidia-smi nvlink)."),
    codes=("NVLINK_DOWN", "NVLINK_ERRORS"),
)
