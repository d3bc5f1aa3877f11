"""Pure rule: `nvidia-smi topo -m` (a `GpuTopology`) -> findings.

- Fewer GPUs than the node should have (`--gpus`, the instance type): GPU_COUNT_LOW.
- Fewer NICs than the instance type's InfiniBand/RoCE adapters: FABRIC_COUNT_LOW. EFA
  adapters are not in `topo -m`, so an EFA expectation is not judged here.
- When most GPU pairs are joined by NVLink (`NV<n>`), a pair with fewer bonded links
  than the others, or none, is TOPOLOGY_NVLINK_MISSING on the GPU(s) it points at. A
  node whose GPUs are bridged in pairs (most pairs PCIe) is not judged this way.
"""

from __future__ import annotations

import re
from collections import Counter

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.checks.fabric.readings import FabricExpectation
from gpuvigil.node.checks.gpu.readings import ExpectedGpus
from gpuvigil.node.checks.topology.readings import GpuTopology
from gpuvigil.node.pipeline.registry import Inputs, rule

SOURCE = "nvidia-smi topo -m"


@rule(
    "topology",
    reads=GpuTopology,
    uses=(ExpectedGpus, FabricExpectation),
    codes=("GPU_COUNT_LOW", "FABRIC_COUNT_LOW", "TOPOLOGY_NVLINK_MISSING"),
)
def topology_rule(topo: GpuTopology, on: Inputs) -> list[Finding]:
    """GPUs and NICs topo -m lists against the node's, and NVLink pairs against each other."""
    out: list[Finding] = []

    def add(status: Status, code: str, component: str, message: str, **evidence) -> None:
        out.append(
            Finding(
                check=on.check,
                status=status,
                code=code,
                component=component,
                message=message,
                action=evidence.pop("action", Action.INVESTIGATE),
                evidence={"source": SOURCE, **evidence},
                observed_at=on.now,
            )
        )

    if topo.problems:
        add(
            Status.FAILED,
            "CHECK_ERROR",
            "node",
            f"{SOURCE}: {'; '.join(topo.problems[:3])}",
            problems=list(topo.problems),
            action=Action.NONE,
        )
    expected = on.get(ExpectedGpus)
    if expected and expected.count is not None and len(topo.gpus) < expected.count:
        add(
            Status.FAILED,
            "GPU_COUNT_LOW",
            "node",
            f"{SOURCE} lists {len(topo.gpus)} GPU(s), {expected.count} expected",
            gpus=list(topo.gpus),
            expected=expected.count,
            expected_from=expected.source,
        )
    fabric = on.get(FabricExpectation)
    if fabric and fabric.count and fabric.kind in ("ib", "roce") and len(topo.nics) < fabric.count:
        add(
            Status.FAILED,
            "FABRIC_COUNT_LOW",
            "node",
            f"{SOURCE} lists {len(topo.nics)} NIC(s), {fabric.count} {fabric.kind} expected",
            nics=list(topo.nics),
            expected=fabric.count,
            expected_from=fabric.source,
        )
    for gpu, pairs in _short_pairs(topo).items():
        add(
            Status.WARNING,
            "TOPOLOGY_NVLINK_MISSING",
            f"gpu:{gpu}",
            f"GPU {gpu} has fewer NVLinks to {len(pairs)} peer(s) than the other GPU pairs",
            pairs=pairs,
            action=Action.RESET_GPU,
        )
    return out


def _links(cell: str) -> int:
    m = re.fullmatch(r"NV(\d+)", cell)
    return int(m.group(1)) if m else 0


def _short_pairs(topo: GpuTopology) -> dict[int, list[dict[str, object]]]:
    if len(topo.pairs) < 1:
        return {}
    counts = Counter(_links(c) for _, _, c in topo.pairs)
    nvlinked = sum(n for links, n in counts.items() if links > 0)
    if nvlinked * 2 <= len(topo.pairs):
        return {}  # mostly PCIe: bridged pairs or no NVLink at all
    usual = max(counts, key=lambda k: (counts[k], k))  # the most common bond width
    short = [(a, b, c) for a, b, c in topo.pairs if _links(c) < usual]
    if not short:
        return {}
    peers = len(topo.gpus) - 1
    per_gpu = Counter(g for a, b, _ in short for g in (a, b))
    # A GPU short to most of its peers is the faulty one; a lone short pair names both.
    blamed = {g for g, n in per_gpu.items() if n * 2 > peers} or set(per_gpu)
    out: dict[int, list[dict[str, object]]] = {}
    for a, b, cell in short:
        for g in (a, b):
            if g in blamed:
                out.setdefault(g, []).append(
                    {"peer": b if g == a else a, "link": cell, "usual": f"NV{usual}"}
                )
    return out
