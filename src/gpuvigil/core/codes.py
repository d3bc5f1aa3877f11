"""Every finding code, its condition family and one line for people: one definition each.

`docs/checks.md` documents the same list; a test keeps the two in step. Xid and SXid codes
are open-ended (`XID_<n>`, `SXID_<n>`) and get their meaning from the catalog.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Condition families, after node-problem-detector: one condition type per problem family.
GPU_XID = "GPUXidError"
GPU_MEMORY = "GPUMemoryError"
GPU_INTERCONNECT = "GPUInterconnectDegraded"
GPU_THERMAL = "GPUThermal"
NETWORK_FABRIC = "NetworkFabricDegraded"
HEALTH_CHECK = "GPUHealthCheckFailing"

FAMILIES = (GPU_XID, GPU_MEMORY, GPU_INTERCONNECT, GPU_THERMAL, NETWORK_FABRIC, HEALTH_CHECK)


@dataclass(frozen=True)
class Code:
    name: str
    family: str
    summary: str


_CODES = [
    # The check itself: could not run, or its result is too old. Always FAILED.
    Code("CHECK_TIMEOUT", HEALTH_CHECK, "a check or the tool it runs did not finish in time"),
    Code("CHECK_ERROR", HEALTH_CHECK, "a check's tool crashed, exited non-zero or printed garbage"),
    Code(
        "DEPENDENCY_MISSING",
        HEALTH_CHECK,
        "a binary, library, device or path a check needs is absent",
    ),
    Code(
        "RESULT_STALE", HEALTH_CHECK, "the latest result is older than twice the check's interval"
    ),
    Code(
        "CHECK_DISABLED",
        HEALTH_CHECK,
        "a check was switched off in the config (reported, not hidden)",
    ),
    Code(
        "ERROR_TEXT",
        HEALTH_CHECK,
        "an input holds an error message (catalog/phrases.yaml) that no rule judged",
    ),
    Code("SOURCE_FALLBACK", HEALTH_CHECK, "the primary source is broken; a fallback is in use"),
    # GPU presence and driver.
    Code(
        "DRIVER_UNAVAILABLE", HEALTH_CHECK, "NVML cannot initialise on a node that should have GPUs"
    ),
    Code("GPU_COUNT_LOW", HEALTH_CHECK, "fewer GPUs than expected for this node"),
    Code("GPU_LOST", HEALTH_CHECK, "a GPU is lost or answers with unknown errors"),
    Code(
        "GPU_INIT_FAILED",
        HEALTH_CHECK,
        "the driver could not initialise a GPU (RmInitAdapter / probe failed)",
    ),
    Code(
        "GPU_RECOVERY_REQUIRED",
        HEALTH_CHECK,
        "the driver says the GPU needs a reset, drain or reboot (NVML recovery action)",
    ),
    Code("DCGM_HEALTH_FAIL", HEALTH_CHECK, "dcgmi health reports a failure"),
    Code("DCGM_DIAG_FAIL", HEALTH_CHECK, "a DCGM diagnostic test failed or could not complete"),
    # Memory.
    Code(
        "ECC_UNCORRECTED_VOLATILE", GPU_MEMORY, "uncorrected ECC errors since the last driver load"
    ),
    Code("ECC_UNCORRECTED_AGGREGATE", GPU_MEMORY, "uncorrected ECC errors over the GPU's lifetime"),
    Code("ECC_DISABLED", GPU_MEMORY, "ECC is switched off on a GPU that supports it"),
    Code("RETIRED_PAGES_PENDING", GPU_MEMORY, "pages are waiting to be retired: reset the GPU"),
    Code("RETIRED_PAGES_LIMIT", GPU_MEMORY, "retired pages reached the replacement threshold"),
    Code("ROW_REMAP_PENDING", GPU_MEMORY, "row remapping is pending: reset the GPU"),
    Code("ROW_REMAP_FAILURE", GPU_MEMORY, "a row remap failed: the GPU needs replacing"),
    Code("GPU_MEMORY_FAULT", GPU_MEMORY, "a device-memory pattern test found bad memory"),
    # Interconnect.
    Code("NVLINK_DOWN", GPU_INTERCONNECT, "an NVLink is inactive"),
    Code("NVLINK_ERRORS", GPU_INTERCONNECT, "NVLink CRC/replay/recovery errors are rising"),
    Code("NVLINK_SLOW", GPU_INTERCONNECT, "GPU-to-GPU bandwidth far below expected"),
    Code("PCIE_DEGRADED", GPU_INTERCONNECT, "a PCIe link runs below its maximum speed or width"),
    Code("PCIE_SLOW", GPU_INTERCONNECT, "host-to-device bandwidth far below expected"),
    # Thermal and power.
    Code("THERMAL_SLOWDOWN", GPU_THERMAL, "the GPU is throttling for temperature"),
    Code("HW_SLOWDOWN", GPU_THERMAL, "hardware slowdown is active"),
    Code("POWER_BRAKE", GPU_THERMAL, "the external power brake is asserted"),
    Code("TEMPERATURE_HIGH", GPU_THERMAL, "GPU or memory temperature above its threshold"),
    # Workload (active) checks.
    Code("GPU_SDC", HEALTH_CHECK, "a computation gave a wrong or non-repeatable result"),
    Code("GPU_SLOW", HEALTH_CHECK, "achieved throughput far below the GPU's expected figure"),
    # Network fabric.
    Code("FABRIC_COUNT_LOW", NETWORK_FABRIC, "fewer network adapters than expected"),
    Code("FABRIC_PORT_DOWN", NETWORK_FABRIC, "a network adapter port is not active / link up"),
    Code("FABRIC_RATE_LOW", NETWORK_FABRIC, "a port's rate is below the expected rate"),
    Code("FABRIC_ERRORS", NETWORK_FABRIC, "link-downed / symbol errors are rising"),
    Code("FABRIC_SLOW", NETWORK_FABRIC, "all-reduce bus bandwidth below the expected fraction"),
    # Pasted tool outputs (analyze): Fabric Manager, NVLink and NIC counters, topology.
    Code("FABRIC_MANAGER_FAILED", GPU_INTERCONNECT, "Fabric Manager failed to start or exited"),
    Code(
        "FABRIC_MANAGER_STOPPED",
        GPU_INTERCONNECT,
        "Fabric Manager was stopped and not started again: NVSwitch GPUs cannot run CUDA work",
    ),
    Code("FABRIC_MANAGER_ERROR", GPU_INTERCONNECT, "Fabric Manager logged an error"),
    Code(
        "GPU_FABRIC_NOT_REGISTERED",
        GPU_INTERCONNECT,
        "a GPU has not completed NVLink fabric registration (nvidia-smi -q Fabric State/Status)",
    ),
    Code(
        "PARTIAL_INPUT",
        HEALTH_CHECK,
        "a filtered or excerpted output: the checks its lines could not support (OK, a note)",
    ),
    Code(
        "NVLINK_ERROR_COUNTS",
        GPU_INTERCONNECT,
        "an NVLink error counter is above its threshold in one capture (since driver load)",
    ),
    Code(
        "NIC_ERROR_COUNTS",
        NETWORK_FABRIC,
        "a NIC port error counter is above its threshold in one capture (perfquery, ethtool -S)",
    ),
    Code(
        "TOPOLOGY_NVLINK_MISSING",
        GPU_INTERCONNECT,
        "nvidia-smi topo -m shows a GPU pair without the NVLinks the other pairs have",
    ),
    # Kernel log stream.
    Code("KMSG_GAP", HEALTH_CHECK, "kernel log records were lost (ring buffer overrun)"),
    Code(
        "AGENT_STATE",
        HEALTH_CHECK,
        "the agent's kept Xid events (agent.state_dir) could not be read or written",
    ),
    # Training (layer 3) records, attributed to a node.
    Code("STRAGGLER", HEALTH_CHECK, "a rank is persistently slower than the gang's median"),
    Code("TRAINING_HANG", HEALTH_CHECK, "a training step did not complete within its timeout"),
]

CODES: dict[str, Code] = {c.name: c for c in _CODES}

# A FAILED finding with one of these codes means "could not tell", not "found a problem".
COULD_NOT_RUN = frozenset(
    {
        "CHECK_TIMEOUT",
        "CHECK_ERROR",
        "DEPENDENCY_MISSING",
        "RESULT_STALE",
        "DRIVER_UNAVAILABLE",
        "ERROR_TEXT",
    }
)

# What a rule declares for the open-ended codes it emits (`@rule(codes=(ANY_XID,))`): the
# family of every XID_<n> (SXID_<n>) is the same, so the placeholder carries it.
ANY_XID = "XID_<n>"
ANY_SXID = "SXID_<n>"

# A negative number too: the kernel-log parser keeps a line that printed one (and gives a
# code that is not a number -1), so its finding is an Xid's, not an unknown check's.
_XID = re.compile(r"^(S?XID)_(-?\d+|<n>)$")


def family_of(code: str) -> str:
    """The condition family of a code; unknown codes count as a failing health check."""
    known = CODES.get(code)
    if known is not None:
        return known.family
    m = _XID.match(code)
    if m:
        return GPU_XID if m.group(1) == "XID" else GPU_INTERCONNECT
    return HEALTH_CHECK


def is_known(code: str) -> bool:
    """A code in the table, or an Xid/SXid code (or their placeholders)."""
    return code in CODES or _XID.match(code) is not None


def declares(declared: frozenset[str], code: str) -> bool:
    """Whether a rule that declared `declared` may emit `code`: one it named, an Xid/SXid
    code under ANY_XID/ANY_SXID, or a could-not-judge code (every rule fails closed)."""
    if code in declared or code in COULD_NOT_RUN:
        return True
    m = _XID.match(code)
    return m is not None and (ANY_XID if m.group(1) == "XID" else ANY_SXID) in declared


def xid(n: int) -> str:
    return f"XID_{n}"


def sxid(n: int) -> str:
    return f"SXID_{n}"
