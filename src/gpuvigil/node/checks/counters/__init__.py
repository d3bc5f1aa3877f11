"""Health domain `counters`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="counters",
    summary=(
        "Error counters and link states from one pasted capture: NVLink (nvidia-smi nvlink "
        "-e, dcgmi nvlink) and NIC ports (perfquery, ethtool -S)."
    ),
    codes=("NVLINK_ERROR_COUNTS", "NIC_ERROR_COUNTS"),
    also_emits=("NVLINK_DOWN",),
)
