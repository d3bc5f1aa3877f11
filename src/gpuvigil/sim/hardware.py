"""Simulated hardware through the real layer-1 code: a fault -> what the node agent reports.

Called by `sim.detect.Layer1` once per fault kind (the verdicts are cached there). Each
fault is a `fakes.faulty.FaultyNode`; every health domain that declares a fake
(`DOMAIN.fake`, its `fake.py`) says what its probes would read of that node (built from
the shared fakes, e.g. the fake NVML read by the real NVML worker's reader, NVRM lines
parsed by the real kernel-log parser, a fake sysfs tree read by the real fabric probe),
and those readings are judged by the real rules through the one pipeline the agent uses
(`node.pipeline.judge`). This module names no domain: a new domain's fake is run with no
edit here. A hung or missing tool is the real fail-closed check runner
(`node.checks.run_check`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.fakes import faults as fake_faults
from gpuvigil.fakes.faults import Fault
from gpuvigil.fakes.faulty import FaultyNode, Seen
from gpuvigil.fakes.gpu import make_node
from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY, CheckContext, Needs, run_check
from gpuvigil.node.checks.domain import find_domains
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline.judge import judge

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
BOOTED = NOW - timedelta(days=3)

# Faults that no node check can see: the host is down (its agent with it), a hung
# collective (the job sees it), silent corruption without an active check.
INVISIBLE = {"HOST_DOWN", "NCCL_HANG"}
# Faults of the tools themselves: the check runner's verdict, whatever the domain.
TOOL_FAULTS = {Fault.TOOL_HANG, Fault.TOOL_MISSING}


def findings_for(fault: str, *, gpu: int, config: NodeConfig | None = None) -> list[Finding]:
    """Every FAILED or WARNING finding layer 1 reports for a node carrying `fault` on GPU
    `gpu` (the one the fault model drew; node-wide faults ignore it). ValueError for a
    fault that no domain's fake knows (a typo must not read as an invisible fault)."""
    cfg = config or sim_node_config()
    if fault in INVISIBLE:
        return []
    node = FaultyNode(fault, gpu, cfg, NOW, BOOTED)
    if node.injected in TOOL_FAULTS:
        return _problems(_tool(hang=node.injected is Fault.TOOL_HANG))
    seen = fake_readings(node)
    if not seen:
        raise ValueError(f"fault {fault!r}: no health domain's fake reads it (DOMAIN.fake)")
    out: list[Finding] = []
    for s in seen:
        out += judged(s, cfg)
    return _problems(out)


def fake_readings(node: FaultyNode) -> list[Seen]:
    """What every domain's fake reads of `node`, domains in name order."""
    out: list[Seen] = []
    for domain in find_domains().values():
        if domain.fake is not None:
            out += domain.resolve(domain.fake)(node)
    return out


def judged(seen: Seen, cfg: NodeConfig) -> list[Finding]:
    """The rules' findings over one check's fake readings, as the agent's pipeline gives them."""
    return judge(list(seen.readings), config=seen.config or cfg, now=NOW, check=seen.check)


def active_findings(fault: str, *, gpu: int) -> list[Finding]:
    """What the active checks (matmul correctness) report: silent corruption shows here."""
    if fault.lower() != Fault.SDC.value:
        return []  # also every fault the shared fakes do not carry (a new domain's)
    node = make_node(8, model="H100")
    fake_faults.apply(node, Fault.SDC, gpu=gpu, seed=0)
    # a GPU that computes wrong answers is RMA material: fatal, REPLACE
    return [
        Finding(check="matmul", status=Status.FAILED, code="GPU_SDC", component=f"gpu:{g.index}",
                message="matmul result differs from the reference", fatal=True,
                action=Action.REPLACE, observed_at=NOW)
        for g in node.gpus
        if g.sdc
    ]  # fmt: skip


@functools.cache
def sim_node_config() -> NodeConfig:
    """The simulated fleet's node config: defaults, plus the boot noise its GPUs print
    (the fake's driver-load Xid), as an operator adds what their fleet shows."""
    return NodeConfig.model_validate(
        {"kernel_log": {"families": {"hopper": {"boot_noise": [fake_faults.BOOT_NOISE_XID]}}}}
    )


def check_interval_s(check: str) -> float:
    """How often the check that produced a finding runs (the agent's schedule)."""
    sweep.load_checks()
    spec = REGISTRY.get(check)
    return spec.interval_s if spec is not None else 60.0


def _problems(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status is not Status.OK]


def _tool(*, hang: bool) -> list[Finding]:
    """The real runner's verdict on a check whose tool hangs or is not installed."""
    sweep.load_checks()
    spec = REGISTRY["gpu"]
    ctx = CheckContext(config=NodeConfig(), env={"PATH": ""})
    if hang:
        spec = replace(spec, fn=lambda _ctx: time.sleep(0.2) or [], timeout_s=0.01)
    else:
        spec = replace(spec, needs=Needs(binaries=("nvidia-smi",)))
    findings, _ = run_check(spec, ctx)
    return findings
