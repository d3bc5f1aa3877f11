"""Deep validation before a node takes work (`gpuvigil preflight`). Settings: `preflight:`.

`run_preflight` runs the fast node checks (the same registry `gpuvigil check` uses), then
the active checks (`node.active.runner`) in the time left of one budget, and returns one
NodeReport plus every measurement (achieved vs expected). Called by the command, the
Slurm prolog script, and on Kubernetes by the preflight pod the controller starts for each
validation; the controller removes the `gpuvigil.io/unvalidated` taint only on a pass that
pod's exit reports (`clusters.k8s_preflight`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gpuvigil.core import naming
from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import CheckRun, Finding, NodeReport, utcnow
from gpuvigil.node import instance, sweep
from gpuvigil.node.active.config import ActiveConfig
from gpuvigil.node.active.results import Measurement
from gpuvigil.node.active.runner import ActiveOutcome, run_active
from gpuvigil.node.checks import CheckContext

FAST_GROUPS = ("fast",)


class PreflightConfig(StrictModel):
    """`preflight:` in the config file. See docs/preflight.md."""

    # The whole run, fast checks included. 2 minutes fits an 8-GPU node: ~10 s of fast
    # checks and worker start, 15 s of sustained load, the rest for memory, transfers and
    # NCCL start-up; checks the budget cannot reach are failures, never skipped.
    budget_s: float = Field(default=120.0, gt=0)
    device: Literal["cuda", "cpu"] = "cuda"  # cpu: the same checks, small sizes, anywhere
    fast_checks: bool = True  # run node checks (as `gpuvigil check` does) first
    # Which check groups: "fast" are the status checks; add "slow" for `dcgmi health`,
    # "diag" for `dcgmi diag` (minutes: raise budget_s with it).
    check_groups: list[Literal["fast", "slow", "diag"]] = Field(default_factory=lambda: ["fast"])
    # Node checks this run cannot do, reported CHECK_DISABLED instead of run: the shipped
    # Kubernetes preflight pod skips `kernel_log` (it has no /dev/kmsg and no privileges;
    # the agent on the same node follows the kernel log all the time).
    skip_checks: list[str] = Field(default_factory=list)
    active: ActiveConfig = Field(default_factory=ActiveConfig)
    node_name: str | None = None  # in the report; default: $NODE_NAME, else the hostname


@dataclass
class PreflightResult:
    report: NodeReport
    measurements: list[Measurement]
    device: str
    devices: list[str] = field(default_factory=list)
    models: list[str | None] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    pci: list[str | None] = field(default_factory=list)
    duration_s: float = 0.0
    budget_s: float = 0.0
    durations_s: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.report.exit_code() == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.report.node,
            "result": "pass" if self.passed else "fail",
            "exit_code": self.report.exit_code(),
            "device": self.device,
            "devices": self.devices,
            "gpu_models": self.models,
            "device_components": self.components,
            "device_pci": self.pci,
            "duration_s": round(self.duration_s, 3),
            "budget_s": self.budget_s,
            "check_durations_s": {k: round(v, 3) for k, v in self.durations_s.items()},
            "measurements": [m.to_json() for m in self.measurements],
            "report": self.report.model_dump(mode="json"),
        }

    def verdict(self, *, now: datetime | None = None) -> dict[str, str]:
        """What `--result-file` writes: on Kubernetes the pod's termination log, which the
        controller reads from the pod's status (`clusters.k8s_preflight`)."""
        problems = sorted({f"{f.component} {f.code}" for f in self.report.problems})
        summary = "all checks passed" if not problems else whole_items(problems, limit=500)
        return {
            "result": "pass" if self.passed else "fail",
            "at": (now or self.report.generated_at).isoformat(),
            "summary": summary,
        }


def whole_items(items: list[str], *, limit: int) -> str:
    """`items` joined by "; " within `limit` characters, whole ones only, then how many
    were left out (a component or code is never cut)."""
    whole = "; ".join(items)
    if len(whole) <= limit:
        return whole
    out: list[str] = []
    for item in items:
        more = f"; (+{len(items) - len(out) - 1} more)"
        if out and len("; ".join([*out, item])) + len(more) > limit:
            break
        out.append(item)
    return "; ".join(out) + f"; (+{len(items) - len(out)} more)"


def internode_expectation(entry: Any) -> float | None:
    """Per-GPU share of the node's fabric, in GB/s: the cross-node busbw to expect."""
    if entry is None:
        return None
    spec = entry[1].fabric
    gpus = entry[1].gpus
    if spec is None or not gpus:
        return None
    total = spec.total_gbps or ((spec.rate_gbps or 0) * spec.count) or None
    return total / 8.0 / gpus if total else None


def run_fast(
    ctx: CheckContext,
    groups: list[str] | tuple[str, ...] = FAST_GROUPS,
    *,
    skipped: list[str] | tuple[str, ...] = (),
) -> tuple[list[Finding], list[CheckRun]]:
    """The node checks of `groups`, run as `gpuvigil check` runs them."""
    report = sweep.run_sweep(ctx, specs=sweep.select(groups=groups), skipped=skipped)
    return list(report.findings), list(report.checks)


def node_name_of(config: Any, node_name: str | None = None) -> str:
    """The node a preflight run reports on (`core.naming`: the one way to name a node)."""
    return naming.node_name(node_name or config.preflight.node_name)


def run_preflight(
    config: Any,  # gpuvigil.config.Config
    *,
    root: Path = Path("/"),
    node_name: str | None = None,
    wrapper: str | None = None,
    env: dict[str, str] | None = None,
    progress: Callable[[str, float | None], None] | None = None,
) -> PreflightResult:
    """Fast checks, then the active checks within the budget. `progress(step, fraction)`
    hears each step start (fraction 0, or None when it cannot tell how far along) and end."""
    pf: PreflightConfig = config.preflight
    step = progress or (lambda _name, _fraction: None)
    t0 = time.monotonic()
    ctx = CheckContext(config=config.node, root=root)
    if env is not None:
        ctx.env = dict(env)
    findings: list[Finding] = []
    runs: list[CheckRun] = []
    durations: dict[str, float] = {}
    if pf.fast_checks:
        step("fast node checks", 0.0)
        findings, runs = run_fast(ctx, pf.check_groups, skipped=pf.skip_checks)
        durations["fast"] = time.monotonic() - t0
        step("fast node checks", 1.0)
    _, entry = instance.lookup(ctx)
    outcome = ActiveOutcome()
    if pf.active.checks:
        active = f"active checks on {pf.device}: {', '.join(pf.active.checks)}"
        step(active, None)
        outcome = run_active(
            pf.active,
            device=pf.device,
            budget_s=max(0.0, pf.budget_s - (time.monotonic() - t0)),
            wrapper=wrapper,
            internode_busbw_gbs=internode_expectation(entry),
            env=env,
        )
        findings += outcome.findings
        durations.update(outcome.durations_s)
        step(active, 1.0)
    name = node_name_of(config, node_name)
    report = NodeReport(
        node=name, generated_at=utcnow(), findings=tuple(findings), checks=tuple(runs)
    )
    return PreflightResult(
        report=report,
        measurements=outcome.measurements,
        device=pf.device,
        devices=outcome.devices,
        models=outcome.models,
        components=outcome.components,
        pci=outcome.pci,
        duration_s=time.monotonic() - t0,
        budget_s=pf.budget_s,
        durations_s=durations,
    )
