"""What a lab run found: `LabResult` (the `--json` record), the figures read from its
timeline, and `gpuvigil report --json` over the run's own event logs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvigil.lab.machine import python_env


@dataclass
class LabResult:
    fault: str
    node: str
    timeline: list[dict[str, Any]]
    remediation_steps: list[str]
    final_state: dict[str, str]
    job: dict[str, Any]
    report: dict[str, Any]
    settled: bool
    duration_s: float
    workdir: str
    figures: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "node": self.node,
            "timeline": self.timeline,
            "remediation_steps": self.remediation_steps,
            "final_state": self.final_state,
            "job": self.job,
            "report": self.report,
            "figures": self.figures,
            "settled": self.settled,
            "duration_s": round(self.duration_s, 1),
            "workdir": self.workdir,
        }


def figures(timeline: list[dict[str, Any]], node: str) -> dict[str, float | None]:
    """Seconds from the fault to: the node blocked, the job running again (the restarted job
    restored its checkpoint, or its first save), the node back in service (or removed)."""

    def first(pred: Any) -> float | None:
        return next((e["t_s"] for e in timeline if e["t_s"] >= 0 and pred(e)), None)

    resumed = first(lambda e: e["event"] == "job.restart") or first(
        lambda e: e["event"] == "job_resumed"
    )
    back = first(
        lambda e: (
            e["node"] == node
            and (
                (e["event"] == "state" and e["detail"].split(":")[0].endswith("-> HEALTHY"))
                or e["event"] == "node_removed"
            )
        )
    )
    return {
        "blocked_s": first(lambda e: e["node"] == node and e["event"] == "block"),
        "job_resumed_s": resumed,
        "back_in_service_s": back,
    }


def report(events: Path) -> dict[str, Any]:
    """Exactly what `gpuvigil report --json --window all` computes from the run's logs."""
    files = sorted(str(p) for p in events.glob("*.jsonl"))
    if not files:
        return {}
    res = subprocess.run(
        [sys.executable, "-m", "gpuvigil", "report", *files, "--json", "--window", "all"],
        capture_output=True, text=True, timeout=60, env=python_env(), check=False,
    )  # fmt: skip
    try:
        return dict(json.loads(res.stdout))
    except ValueError:
        return {"error": f"gpuvigil report exited {res.returncode}: {res.stderr[-500:]}"}
