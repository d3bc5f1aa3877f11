"""What a captured file is, told from its content (never from its name). Pure.

`detect(head)` looks at the first 64 KiB (already decoded to UTF-8) and returns the kind
whose marks it carries, or None: a file that is none of these is named as not recognised
and never judged. `--kind` forces one (`KINDS`). The order matters where outputs share
marks: the tools' own headers first, the kernel log (the loosest) last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuvigil.node.capture import tool_kinds


@dataclass(frozen=True)
class Kind:
    name: str  # what --kind takes
    check: str  # the check its findings belong to (as in `gpuvigil check`)
    what: str  # for people: the command that prints it


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("nvidia-smi-xml", "gpu", "nvidia-smi -q -x"),
        Kind("nvidia-smi-q", "gpu", "nvidia-smi -q [-d ...] (text)"),
        Kind("nvidia-smi-csv", "gpu", "nvidia-smi --query-gpu=... --format=csv"),
        Kind("nvidia-smi-nvlink", "gpu", "nvidia-smi nvlink -s"),
        Kind("nvidia-smi-error", "gpu", "nvidia-smi's error answer"),
        Kind("dcgmi-diag", "dcgm_diag", "dcgmi diag -r N [-j]"),
        Kind("dcgmi-health", "dcgm_health", "dcgmi health -c [-j]"),
        Kind("dcgmi-discovery", "dcgm_discovery", "dcgmi discovery -l"),
        Kind("ibstat", "fabric", "ibstat"),
        Kind("ibstatus", "fabric", "ibstatus"),
        Kind("ibv_devinfo", "fabric", "ibv_devinfo [-v]"),
        Kind("ibdev2netdev", "fabric", "ibdev2netdev [-v]"),
        Kind("fi_info", "fabric", "fi_info -p efa"),
        Kind("kernel-log", "kernel_log", "a kernel log (dmesg, journalctl -k, syslog, kmsg)"),
        Kind("sysfs", "fabric", "a captured /sys tree (folder or tar)"),
    )
}
# The pasted-tool kinds (Fabric Manager, topo -m, the plain table, NVLink and NIC counters,
# rdma link): declared, detected and read in `capture.tool_kinds`.
KINDS |= {k.name: k for k in tool_kinds.kinds()}

_M = re.MULTILINE
_MARKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("nvidia-smi-xml", re.compile(r"<nvidia_smi_log\b")),
    ("nvidia-smi-q", re.compile(r"NVSMI LOG|^Attached GPUs\s*:", _M)),
    # DCGM 4.x says which GPUs it counted: "1 GPU found (Active)."
    ("dcgmi-discovery", re.compile(r"^\s*\d+ GPUs? found(?: \([^)]*\))?\.\s*$", _M)),
    (
        "dcgmi-diag",
        re.compile(
            r"Successfully ran diagnostic for group|^\|\s*Diagnostic\s*\|\s*Result\s*\||"
            r'"DCGM (?:GPU )?Diagnostic"',
            _M,
        ),
    ),
    # Only the report's own words: `dcgmi topo -j`, `nvlink -e -j`... share its JSON framing.
    ("dcgmi-health", re.compile(r"Health Monitor Report|Overall Health", re.I)),
    ("ibstat", re.compile(r"^CA '[^']+'\s*$", _M)),
    ("ibstatus", re.compile(r"^Infiniband device '[^']+' port \d+ status:", _M)),
    ("ibv_devinfo", re.compile(r"^hca_id:\s*\S+", _M)),
    # `| column -t` widens the gaps; `-v` pads the state: "port 1 (DOWN  ) ==> ib2 (Down)".
    (
        "ibdev2netdev",
        re.compile(
            r"^(?:\S+\s+)?\S+\s+.*?port\s+\d+(?:\s+\(\s*[A-Z_]+\s*\))?\s+==>\s+\S+\s+\(", _M
        ),
    ),
    ("fi_info", re.compile(r"^(?:\s*\[\d+,\d+\]<std\w+>:)?\s*provider:\s*\S+\s*$", _M)),
    ("nvidia-smi-nvlink", re.compile(r"^GPU \d+: .*\(UUID: GPU-[0-9a-fA-F-]+\)\s*$", _M)),
)


def detect(head: bytes) -> str | None:
    """The kind of a capture from its first bytes, or None when it is none we read."""
    # Imported here: the table above is read by `--help`, which should not load the readers.
    from gpuvigil.node.checks.gpu import nvidia_smi_csv, nvidia_smi_errors

    text = head.decode("utf-8", errors="replace")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    strong = tool_kinds.detect(text, lines, strong=True)
    if strong is not None:
        return strong
    for name, mark in _MARKS:
        if mark.search(text):
            return name
    shaped = tool_kinds.detect(text, lines, strong=False)
    if shaped is not None:
        return shaped
    if lines and nvidia_smi_csv.looks_like_header(lines[0]):
        return "nvidia-smi-csv"
    said = nvidia_smi_errors.scan(text)
    if said.lost or said.driver or said.no_devices:
        return "nvidia-smi-error"
    return "kernel-log" if _kernel_log(lines) else None


def _kernel_log(lines: list[str]) -> bool:
    """Most of the first lines look like kernel-log lines, or an NVIDIA driver line is
    there (a grep of a kernel log)."""
    from gpuvigil.node.checks.kernel_log.kernel_log_shape import looks_like_kernel_line

    sample = lines[:50]
    if not sample:
        return False
    if any("NVRM:" in ln or "Xid (" in ln for ln in lines[:2000]):
        return True
    kernelish = sum(1 for ln in sample if looks_like_kernel_line(ln))
    return kernelish * 2 >= len(sample)
