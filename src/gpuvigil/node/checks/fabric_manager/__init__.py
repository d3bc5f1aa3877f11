"""Health domain `fabric_manager`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

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
    formats=(
        Format(
            "fabric-manager",
            "fabric_manager",
            "journalctl -u nvidia-fabricmanager, /var/log/fabricmanager.log, "
            "systemctl status nvidia-fabricmanager",
            read="formats:read_log",
            detect=(Detector(45, "formats:is_log"),),
        ),
    ),
)
