"""Health domain `active`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="active",
    summary=(
        "The active checks' pure judgements: errors vs tolerance, throughput vs expected, a "
        "device vs its peers (`node/active` runs the workloads)."
    ),
    codes=("GPU_MEMORY_FAULT", "NVLINK_SLOW", "PCIE_SLOW", "GPU_SDC", "GPU_SLOW", "FABRIC_SLOW"),
)
