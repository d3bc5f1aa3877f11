"""Health domain `dcgm`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="dcgm",
    summary=("DCGM: dcgmi health and diag, and the GPUs dcgmi discovery lists."),
    codes=("DCGM_HEALTH_FAIL", "DCGM_DIAG_FAIL"),
    formats=(
        Format(
            "dcgmi-diag",
            "dcgm_diag",
            "dcgmi diag -r N [-j]",
            read="formats:read_diag",
            detect=(Detector(23, "formats:is_diag"), Detector(47, "formats:is_diag_fragment")),
        ),
        Format(
            "dcgmi-health",
            "dcgm_health",
            "dcgmi health -c [-j]",
            read="formats:read_health",
            detect=(Detector(24, "formats:is_health"),),
        ),
        Format(
            "dcgmi-discovery",
            "dcgm_discovery",
            "dcgmi discovery -l",
            read="formats:read_discovery",
            detect=(Detector(22, "formats:is_discovery"),),
        ),
    ),
)
