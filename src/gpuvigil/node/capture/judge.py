"""Readers and rules for each kind of capture: bytes -> typed readings -> findings.

`read(kind, data)` turns a document into its readings (the same readings the live checks
build); `judge(reading, ...)` hands a reading, with the facts `analyze` knows (the GPUs and
fabric to expect, the GPUs the bundle named), to `node.pipeline`: the same rules, through
the same path, as the live checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuvigil.core.findings import Finding
from gpuvigil.node.capture import tool_kinds
from gpuvigil.node.checks.dcgm.dcgm_discovery import parse_discovery
from gpuvigil.node.checks.dcgm.dcgm_health_parse import parse_health
from gpuvigil.node.checks.dcgm.dcgm_parse import parse_diag
from gpuvigil.node.checks.dcgm.readings import DcgmReport
from gpuvigil.node.checks.fabric import fabric_tools
from gpuvigil.node.checks.fabric.readings import FabricExpectation, FabricReading
from gpuvigil.node.checks.gpu import nvidia_smi
from gpuvigil.node.checks.gpu.nvidia_smi_csv import parse_csv
from gpuvigil.node.checks.gpu.readings import ExpectedGpus, GpuInventory, GpuRef
from gpuvigil.node.checks.kernel_log import kernel_log_capture
from gpuvigil.node.checks.nvlink.nvidia_smi_nvlink import parse_nvlink_status
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline.judge import judge as pipeline_judge

Reading = GpuInventory | DcgmReport | FabricReading | kernel_log_capture.Capture


@dataclass(frozen=True)
class Expect:
    """What the node should have: GPUs, and the fabric per adapter kind."""

    gpus: int | None = None
    ib: FabricExpectation = field(default_factory=FabricExpectation)
    efa: FabricExpectation = field(default_factory=FabricExpectation)


def read(kind: str, data: bytes) -> list[Reading]:
    """The readings of one document (fi_info behind mpirun is one reading per rank)."""
    text = data.decode("utf-8", errors="replace")
    pasted = tool_kinds.read(kind, text)  # the pasted-tool kinds (capture.tool_kinds)
    if pasted is not None:
        return pasted  # type: ignore[return-value]
    if kind in ("nvidia-smi-xml", "nvidia-smi-q", "nvidia-smi-error"):
        return [nvidia_smi.parse_xml(text)]
    if kind == "nvidia-smi-csv":
        return [parse_csv(text)]
    if kind == "nvidia-smi-nvlink":
        return [parse_nvlink_status(text)]
    if kind == "dcgmi-diag":
        return [parse_diag(text)]
    if kind == "dcgmi-health":
        return [parse_health(text)]
    if kind == "dcgmi-discovery":
        return [parse_discovery(text)]
    if kind == "fi_info":
        return list(fabric_tools.fi_info_reading(text))
    parse = {
        "ibstat": fabric_tools.parse_ibstat,
        "ibstatus": fabric_tools.parse_ibstatus,
        "ibv_devinfo": fabric_tools.parse_ibv_devinfo,
        "ibdev2netdev": fabric_tools.parse_ibdev2netdev,
    }[kind]
    return [parse(text)]


def judge(
    reading: Reading,
    *,
    node: NodeConfig,
    expect: Expect,
    now: datetime,
    check: str,
    gpus: Mapping[str, GpuRef] | None = None,
) -> list[Finding]:
    if isinstance(reading, tool_kinds.TOOL_READINGS):
        return tool_kinds.judge(reading, node=node, expect=expect, now=now, check=check)
    if isinstance(reading, GpuInventory):
        expected = ExpectedGpus(expect.gpus, "analyze" if expect.gpus is not None else "none")
        return pipeline_judge(
            [reading, expected], config=node, now=reading.observed_at, check=check
        )
    if isinstance(reading, DcgmReport):
        return pipeline_judge([reading], config=node, now=now, check=check)
    if isinstance(reading, FabricReading):
        efa = reading.source.startswith("fi_info") or any(a.kind == "efa" for a in reading.adapters)
        fabric = expect.efa if efa else expect.ib
        return pipeline_judge([reading, fabric], config=node, now=now, check=check)
    return kernel_log_capture.judge(reading, cfg=node.kernel_log, gpus=gpus)
