"""Health domain `fabric`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="fabric",
    summary=(
        "The network fabric: InfiniBand/EFA/RoCE adapters and ports from sysfs, fi_info and "
        "rdma link."
    ),
    codes=("FABRIC_COUNT_LOW", "FABRIC_PORT_DOWN", "FABRIC_RATE_LOW", "FABRIC_ERRORS"),
    formats=(
        Format(
            "ibstat",
            "fabric",
            "ibstat",
            read="formats:read_ibstat",
            detect=(Detector(25, "formats:is_ibstat"),),
        ),
        Format(
            "ibstatus",
            "fabric",
            "ibstatus",
            read="formats:read_ibstatus",
            detect=(Detector(26, "formats:is_ibstatus"),),
        ),
        Format(
            "ibv_devinfo",
            "fabric",
            "ibv_devinfo [-v]",
            read="formats:read_ibv_devinfo",
            detect=(Detector(27, "formats:is_ibv_devinfo"),),
        ),
        Format(
            "ibdev2netdev",
            "fabric",
            "ibdev2netdev [-v]",
            read="formats:read_ibdev2netdev",
            detect=(Detector(28, "formats:is_ibdev2netdev"),),
        ),
        Format(
            "fi_info",
            "fabric",
            "fi_info -p efa",
            read="formats:read_fi_info",
            detect=(Detector(29, "formats:is_fi_info"),),
        ),
        Format(
            "rdma-link",
            "fabric",
            "rdma link [show]",
            read="formats:read_rdma_link",
            detect=(Detector(44, "formats:is_rdma_link"),),
        ),
        # A folder or a tar of one (`capture.bundle` tells it): the fabric and PCIe checks
        # run over it.
        Format("sysfs", "fabric", "a captured /sys tree (folder or tar)"),
    ),
    fake="fake:readings",
)
