"""Health domain `pcie`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="pcie",
    summary=("PCIe links of the GPUs and NICs from sysfs: speed and width against their maximum."),
    codes=("PCIE_DEGRADED",),
)
