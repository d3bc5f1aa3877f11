"""Health domain `dcgm`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="dcgm",
    summary=("DCGM: dcgmi health and diag, and the GPUs dcgmi discovery lists."),
    codes=("DCGM_HEALTH_FAIL", "DCGM_DIAG_FAIL"),
)
