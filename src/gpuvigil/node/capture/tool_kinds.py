"""The pasted-tool kinds `analyze` reads beyond the live checks' outputs: Fabric Manager
logs, `rdma link`, `nvidia-smi topo -m`, the plain `nvidia-smi` table, NVLink counters
(`nvidia-smi nvlink -e`, `dcgmi nvlink -e/-s`), `perfquery` and `ethtool -S`.

One place per format: its `Kind`, how it is told from its content (`detect`, called by
`kinds.detect` before the kernel-log guess) and its reader (`read`, called by
`judge.read`), and what the rules need beside its reading (`judge`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING

from gpuvigil.node.checks.counters.readings import NicCounters, NvLinkReport
from gpuvigil.node.checks.fabric_manager.readings import FabricManagerLog, GpuFabricStates
from gpuvigil.node.checks.gpu.readings import PartialGpuInventory
from gpuvigil.node.checks.topology.readings import GpuTopology

if TYPE_CHECKING:
    from gpuvigil.core.findings import Finding
    from gpuvigil.node.capture.judge import Expect
    from gpuvigil.node.capture.kinds import Kind
    from gpuvigil.node.config import NodeConfig

TOOL_READINGS = (
    FabricManagerLog,
    NvLinkReport,
    NicCounters,
    GpuTopology,
    GpuFabricStates,
    PartialGpuInventory,
)


def kinds() -> tuple[Kind, ...]:
    from gpuvigil.node.capture.kinds import Kind

    return (
        Kind(
            "fabric-manager",
            "fabric_manager",
            "journalctl -u nvidia-fabricmanager, /var/log/fabricmanager.log, "
            "systemctl status nvidia-fabricmanager",
        ),
        Kind("nvidia-smi-table", "gpu", "nvidia-smi (the plain table)"),
        Kind("nvidia-smi-topo", "gpu", "nvidia-smi topo -m"),
        Kind("nvlink-counters", "gpu", "nvidia-smi nvlink -e, dcgmi nvlink -e [-j] / -s"),
        Kind("rdma-link", "fabric", "rdma link [show]"),
        Kind("perfquery", "fabric", "perfquery [-x] [lid port]"),
        Kind("ethtool-stats", "fabric", "ethtool -S <interface>"),
    )


def detect(text: str, lines: list[str], *, strong: bool) -> str | None:
    """The kind of a pasted tool output, or None. `strong`: only the kinds that must win
    over another kind's mark (`nvlink -e` carries the `nvlink -s` GPU lines), tried before
    the marks; else the rest, tried after the marks (so a bundle that holds a whole `-q`
    stays `-q`) and before the kernel-log guess."""
    from gpuvigil.node.checks.counters import nic_counters, nvlink_counters
    from gpuvigil.node.checks.fabric import rdma_link
    from gpuvigil.node.checks.fabric_manager import fabric_manager_log
    from gpuvigil.node.checks.gpu import nvidia_smi_partial, nvidia_smi_table
    from gpuvigil.node.checks.topology import topology

    if strong:
        if nvlink_counters.looks_like(text) or _dcgmi_nvlink_json(text):
            return "nvlink-counters"
        return None
    if topology.header_of(lines) is not None:
        return "nvidia-smi-topo"
    if nvidia_smi_table.looks_like(text):
        return "nvidia-smi-table"
    nic = nic_counters.looks_like(text)
    if nic is not None:
        return "perfquery" if nic == "perfquery" else "ethtool-stats"
    if rdma_link.looks_like(lines):
        return "rdma-link"
    if fabric_manager_log.looks_like(lines):
        return "fabric-manager"
    if nvidia_smi_partial.looks_like_excerpt(lines):
        return "nvidia-smi-q"  # one section of `-q`, without its header
    if any(_DIAG_ROW.match(ln) or _DIAG_SECTION.match(ln) for ln in lines[:400]):
        return "dcgmi-diag"  # a fragment of the diag table, without its header
    return None


# A row or a section rule of the `dcgmi diag` table (DCGM 2.x-4.x test names), for pasted
# fragments that lack the `| Diagnostic | Result |` header.
_DIAG_ROW = re.compile(
    r"^\|\s*(?:GPU Memory|Memtest|Memory Bandwidth|Diagnostic|PCIe|SM Stress|Targeted Stress|"
    r"Targeted Power|Pulse Test|EUD|Denylist|Blacklist|NVML Library|CUDA Main Library|"
    r"Permissions and OS Blocks|Persistence Mode|Environment Variables|Page Retirement/Row Remap|"
    r"Graphics Processes|Inforom|Fabric Manager|software|memory|pcie|diagnostic|targeted_stress|"
    r"targeted_power|memory_bandwidth|memtest|pulse_test|nvbandwidth)\s*\|\s*"
    r"(?:Pass|Fail|Skip|Warn|Not Run)\b",
    re.I,
)
_DIAG_SECTION = re.compile(
    r"^[+|]-{3,}\s+(?:Metadata|Deployment|Integration|Hardware|Stress)\s+-+[+|]"
)


def _dcgmi_nvlink_json(text: str) -> bool:
    return text.lstrip().startswith("{") and re.search(r'"NVLINK Error Counts"', text) is not None


def read(kind: str, text: str) -> list[object] | None:
    """The readings of one of these kinds, or None for a kind that is not one of them."""
    from gpuvigil.node.checks.counters import nic_counters, nvlink_counters
    from gpuvigil.node.checks.fabric import rdma_link
    from gpuvigil.node.checks.fabric_manager import fabric_manager_log
    from gpuvigil.node.checks.gpu import nvidia_smi, nvidia_smi_partial, nvidia_smi_table
    from gpuvigil.node.checks.nvlink import nvidia_smi_nvlink
    from gpuvigil.node.checks.topology import topology

    if kind == "nvidia-smi-q":  # whole or partial `-q` text; its Fabric sections too
        if nvidia_smi_partial.is_partial(text):
            partial = nvidia_smi_partial.parse(text)
            gpus, first = partial.inventory.gpus, partial
        else:
            inv = nvidia_smi.parse_xml(text)
            gpus, first = inv.gpus, inv
        fabric = nvidia_smi_partial.fabric_states(text, gpus)
        return [first] + ([fabric] if fabric is not None else [])
    if kind == "fabric-manager":
        return [fabric_manager_log.parse(text)]
    if kind == "nvidia-smi-table":
        return [nvidia_smi_table.parse(text)]
    if kind == "nvidia-smi-topo":
        return [topology.parse(text)]
    if kind == "nvlink-counters":
        out: list[object] = [nvlink_counters.parse(text)]
        if re.search(r"^\s+Link \d+: \S+ [GM]B/s", text, re.M):  # `-s` pasted with `-e`
            out.append(nvidia_smi_nvlink.parse_nvlink_status(text))
        return out
    if kind == "rdma-link":
        return [rdma_link.parse(text)]
    if kind in ("perfquery", "ethtool-stats"):
        return [nic_counters.parse(text)]
    return None


def judge(
    reading: object, *, node: NodeConfig, expect: Expect, now: datetime, check: str
) -> list[Finding]:
    from gpuvigil.node.checks.gpu.readings import ExpectedGpus
    from gpuvigil.node.pipeline.judge import judge as pipeline_judge

    if isinstance(reading, PartialGpuInventory):
        return _partial(reading, node=node, expect=expect, now=now, check=check)
    facts: list[object] = [reading]
    if isinstance(reading, GpuTopology):
        expected = ExpectedGpus(expect.gpus, "analyze" if expect.gpus is not None else "none")
        fabric = expect.ib if expect.ib.count else expect.efa
        facts += [expected, fabric]
    return pipeline_judge(facts, config=node, now=now, check=check)


def _partial(
    reading: PartialGpuInventory, *, node: NodeConfig, expect: Expect, now: datetime, check: str
) -> list[Finding]:
    """The GPU rules over what the lines hold; the count only when the output states it
    (`Attached GPUs`); findings of a GPU the output does not place are named by its bus
    id; and an OK note listing the checks the missing sections left unmade."""
    from gpuvigil.core.findings import Finding, Status
    from gpuvigil.node.checks.gpu.readings import ExpectedGpus
    from gpuvigil.node.pipeline.judge import judge as pipeline_judge

    inv = reading.inventory
    if not reading.sections and not any(g.lost for g in inv.gpus) and not inv.errors:
        return [
            Finding(
                check=check,
                status=Status.FAILED,
                code="CHECK_ERROR",
                component="node",
                message="no nvidia-smi -q section this reader knows in the input: nothing judged",
                evidence={"command": reading.command},
                observed_at=now,
            )
        ]
    stated = inv.count is not None and expect.gpus is not None
    expected = ExpectedGpus(expect.gpus if stated else None, "analyze" if stated else "none")
    out = pipeline_judge([inv, expected], config=node, now=inv.observed_at, check=check)
    names = {f"gpu:{index}": f"gpu:{bus}" for index, bus in reading.unnamed}
    out = [f.model_copy(update={"component": names.get(f.component, f.component)}) for f in out]
    out.append(
        Finding(
            check=check,
            status=Status.OK,
            code="PARTIAL_INPUT",
            component="node",
            message="a filtered nvidia-smi -q: not checked: "
            + (", ".join(reading.not_checked) or "nothing"),
            evidence={
                "sections": list(reading.sections),
                "not_checked": list(reading.not_checked),
                "command": reading.command,
                "gpus_not_placed": [bus for _, bus in reading.unnamed],
            },
            observed_at=now,
        )
    )
    return out
