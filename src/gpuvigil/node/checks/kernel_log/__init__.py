"""Health domain `kernel_log`: its spec. Its probes, readings and rules are the modules
beside this one; `node.checks.domain.load_domains` finds them."""

from gpuvigil.node.checks.domain import Detector, Domain, Format

DOMAIN = Domain(
    name="kernel_log",
    summary=("The kernel log: Xid and SXid events, driver faults, the /dev/kmsg stream."),
    codes=("XID_<n>", "SXID_<n>", "GPU_INIT_FAILED", "KMSG_GAP"),
    also_emits=("GPU_LOST", "NVLINK_DOWN"),
    # Streamed by `capture.session` (no reader here), after the documents that name GPUs.
    formats=(
        Format(
            "kernel-log",
            "kernel_log",
            "a kernel log (dmesg, journalctl -k, syslog, kmsg)",
            detect=(Detector(60, "formats:is_kernel_log"),),
        ),
    ),
    fake="fake:readings",
)
