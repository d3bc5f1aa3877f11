"""Health domain `counters`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="counters",
    summary=(
        "Error counters and link states from one pasted capture: NVLink (nvidia-smi nvlink "
        "-e, dcgmi nvlink) and NIC ports (perfquery, ethtool -S)."
    ),
    codes=("NVLINK_ERROR_COUNTS", "NIC_ERROR_COUNTS"),
    also_emits=("NVLINK_DOWN",),
    formats=(
        Format(
            "nvlink-counters",
            "gpu",
            "nvidia-smi nvlink -e, dcgmi nvlink -e [-j] / -s",
            read="formats:read_nvlink_counters",
            detect=(Detector(10, "formats:is_nvlink_counters"),),
        ),
        Format(
            "perfquery",
            "fabric",
            "perfquery [-x] [lid port]",
            read="formats:read_nic_counters",
            detect=(Detector(42, "formats:is_perfquery"),),
        ),
        Format(
            "ethtool-stats",
            "fabric",
            "ethtool -S <interface>",
            read="formats:read_nic_counters",
            detect=(Detector(43, "formats:is_ethtool"),),
        ),
    ),
)
