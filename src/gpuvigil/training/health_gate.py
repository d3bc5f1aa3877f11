"""The health gate: a rank refuses to start on a node the gpuvigil agent marks unhealthy.

Called by `process_group.init` before the process group forms (so a bad node never joins
the collective). Reads the agent's state file (a `core.findings.NodeReport` JSON written
atomically by the agent's state-file sink). Fails closed: a missing, unreadable or stale
file refuses too, unless `on_missing: allow`. `decide` is pure and unit-tested; `check`
does the one read.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpuvigil.core import exit_codes, freshness
from gpuvigil.core.findings import NodeReport, Status
from gpuvigil.training.config import HealthGateConfig


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    exit_code: int  # 0 when allowed
    message: str


class NodeRefused(SystemExit):
    """Raised to stop the worker with the verdict's exit code; the message is logged first."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.exit_code)
        self.verdict = verdict


def read(path: Path) -> tuple[NodeReport | None, str]:
    """The report in `path` and "", or None and why it could not be read (never raises)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or e}"
    try:
        # NodeReport drops its own computed fields (status, conditions, family) on load.
        return NodeReport.model_validate_json(raw), ""
    except (ValueError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return None, f"{path} is not a gpuvigil NodeReport: {first}"


def decide(
    report: NodeReport | None, problem: str, *, config: HealthGateConfig, now: datetime
) -> Verdict:
    """Pure: may this rank run, given the agent's report (or why there is none)?"""
    if report is not None:
        age = freshness.judge(report.generated_at, now=now, max_age_s=config.max_age_s)
        if not age.fresh:
            report, problem = (
                None,
                (
                    f"state file is {age.freshness}: {age.describe()} "
                    f"(max_age_s={config.max_age_s:g}); is the gpuvigil agent running?"
                ),
            )
    if report is None:
        if config.on_missing == "allow":
            return Verdict(True, 0, f"gpuvigil health gate: {problem}; allowed (on_missing=allow)")
        return Verdict(
            False,
            exit_codes.NODE_STATE_UNKNOWN,
            f"gpuvigil health gate: refusing to run: {problem} (fail closed; set "
            "health_gate.on_missing=allow to run without the agent)",
        )
    threshold = Status.WARNING if config.refuse_on == "warning" else Status.FAILED
    bad = [f for f in report.problems if f.status.rank >= threshold.rank]
    if not bad:
        return Verdict(True, 0, f"gpuvigil health gate: node {report.node} is {report.status}")
    shown = ", ".join(f"{f.code} on {f.component}" for f in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return Verdict(
        False,
        exit_codes.NODE_UNHEALTHY,
        f"gpuvigil health gate: refusing to run on node {report.node}: "
        f"status {report.status}: {shown}{more}",
    )


def check(config: HealthGateConfig, *, now: datetime) -> Verdict:
    if not config.enabled:
        return Verdict(True, 0, "gpuvigil health gate: disabled by config")
    report, problem = read(config.state_file)
    return decide(report, problem, config=config, now=now)
