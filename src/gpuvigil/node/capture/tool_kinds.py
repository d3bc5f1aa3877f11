"""What the rules need beside the readings of the pasted-tool kinds (Fabric Manager logs,
`nvidia-smi topo -m`, NVLink and NIC counters, partial `nvidia-smi -q`), called by
`capture.judge.judge`. The kinds, how each is told and read, are their domains'
(`DOMAIN.formats`, in each domain's `formats.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from gpuvigil.node.checks.gpu.readings import PartialGpuInventory
from gpuvigil.node.checks.topology.readings import GpuTopology

if TYPE_CHECKING:
    from gpuvigil.core.findings import Finding
    from gpuvigil.node.capture.judge import Expect
    from gpuvigil.node.config import NodeConfig

# The readings judged with more than themselves (the others: `capture.judge.judge`).
TOOL_READINGS = (GpuTopology, PartialGpuInventory)


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
