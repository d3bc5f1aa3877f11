"""Health domain `topology`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="topology",
    summary=("nvidia-smi topo -m: the GPU/NIC matrix against the instance type's."),
    codes=("TOPOLOGY_NVLINK_MISSING",),
    also_emits=("FABRIC_COUNT_LOW", "GPU_COUNT_LOW"),
    formats=(
        Format(
            "nvidia-smi-topo",
            "gpu",
            "nvidia-smi topo -m",
            read="formats:read_topo",
            detect=(Detector(40, "formats:is_topo"),),
        ),
    ),
)
