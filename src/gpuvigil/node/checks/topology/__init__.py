"""Health domain `topology`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="topology",
    summary=("nvidia-smi topo -m: the GPU/NIC matrix against the instance type's."),
    codes=("TOPOLOGY_NVLINK_MISSING",),
    also_emits=("FABRIC_COUNT_LOW", "GPU_COUNT_LOW"),
)
