"""Health domain `fabric_manager`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="fabric_manager",
    summary=("NVIDIA Fabric Manager's log and the GPUs' NVLink fabric registration."),
    codes=(
        "FABRIC_MANAGER_FAILED",
        "FABRIC_MANAGER_STOPPED",
        "FABRIC_MANAGER_ERROR",
        "GPU_FABRIC_NOT_REGISTERED",
    ),
    also_emits=("SXID_<n>",),
)
