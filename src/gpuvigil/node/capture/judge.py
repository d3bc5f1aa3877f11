"""Readers and rules for each kind of capture: bytes -> typed readings -> findings.

`read(kind, data)` turns a document into its readings with the reader its domain declares
(`capture.kinds.reader`: the same readings the live checks build); `judge(reading, ...)`
hands a reading to `node.pipeline`: the same rules, through the same path, as the live
checks. A reading is judged alone unless `analyze` knows facts its rules use (the GPUs
and fabric to expect, the GPUs the bundle named): those readings are named here, and a
new domain's reading needs none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpuvigil.core.findings import Finding
from gpuvigil.node.capture import kinds, tool_kinds
from gpuvigil.node.checks.fabric.readings import FabricExpectation, FabricReading
from gpuvigil.node.checks.gpu.readings import ExpectedGpus, GpuInventory, GpuRef
from gpuvigil.node.checks.kernel_log import kernel_log_capture
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline.judge import judge as pipeline_judge


@dataclass(frozen=True)
class Expect:
    """What the node should have: GPUs, and the fabric per adapter kind."""

    gpus: int | None = None
    ib: FabricExpectation = field(default_factory=FabricExpectation)
    efa: FabricExpectation = field(default_factory=FabricExpectation)


def read(kind: str, data: bytes) -> list[object]:
    """The readings of one document (fi_info behind mpirun is one reading per rank)."""
    fn = kinds.reader(kind)
    if fn is None:
        raise ValueError(f"{kind} is not read as a document")
    return list(fn(data.decode("utf-8", errors="replace")))


def judge(
    reading: object,
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
    if isinstance(reading, FabricReading):
        efa = reading.source.startswith("fi_info") or any(a.kind == "efa" for a in reading.adapters)
        fabric = expect.efa if efa else expect.ib
        return pipeline_judge([reading, fabric], config=node, now=now, check=check)
    if isinstance(reading, kernel_log_capture.Capture):
        return kernel_log_capture.judge(reading, cfg=node.kernel_log, gpus=gpus)
    # Any other domain's reading (DCGM's, a new domain's): its rules, with no more facts.
    return pipeline_judge([reading], config=node, now=now, check=check)
