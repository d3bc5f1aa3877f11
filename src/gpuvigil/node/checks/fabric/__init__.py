"""Health domain `fabric`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="fabric",
    summary=(
        "The network fabric: InfiniBand/EFA/RoCE adapters and ports from sysfs, fi_info and "
        "rdma link."
    ),
    codes=("FABRIC_COUNT_LOW", "FABRIC_PORT_DOWN", "FABRIC_RATE_LOW", "FABRIC_ERRORS"),
)
