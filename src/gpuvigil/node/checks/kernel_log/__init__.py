"""Health domain `kernel_log`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Domain

DOMAIN = Domain(
    name="kernel_log",
    summary=("The kernel log: Xid and SXid events, driver faults, the /dev/kmsg stream."),
    codes=("XID_<n>", "SXID_<n>", "GPU_INIT_FAILED", "KMSG_GAP"),
    also_emits=("GPU_LOST", "NVLINK_DOWN"),
)
