"""What a lab run found: `LabResult` (the `--json` record of one fault), the figures read
from its timeline, the job's outcome, and `gpuvigil report --json` over the event logs
written while that fault ran (sliced out of the lab's logs)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvigil.lab.jobs import GangJob
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
    # each gpuvigil part: its API identity, what it ran from, what the API server refused it
    parts: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    # --alerts: each alert of the fault, measured from it (lab/alerting.py); an alert
    # that fired before the fault has a negative fired_after_s (a healthy lab has none)
    alerts: list[dict[str, Any]] | None = None
    alerts_watched_before_fault_s: float | None = None  # how long the lab watched first
    # --alerts: the dashboard's Xid and remediation panels and the lab's own counts
    dashboard: dict[str, Any] | None = None
    # --workload serving: demand, the fewest Ready replicas, the scale-up (lab/serving.py)
    serving: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        alerting = {} if self.alerts is None else {
            "alerts": self.alerts,
            "alerts_watched_before_fault_s": self.alerts_watched_before_fault_s,
            "dashboard": self.dashboard,
        }  # fmt: skip
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
            "parts": self.parts,
            **alerting,
            **({} if self.serving is None else {"serving": self.serving}),
        }


def figures(timeline: list[dict[str, Any]], node: str, *, gpus_out: int | None = None
            ) -> dict[str, Any]:  # fmt: skip
    """Seconds from the fault to: the node blocked, the job running again (the restarted job
    restored its checkpoint, or its first save), the node back in service (or removed), its
    GPU isolated (the per-GPU path); the phases of the fault's gang restart
    (`restart_phases`); and `gpus_out`, the most GPUs out of service at once (`Follower`)."""

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
    isolated = first(
        lambda e: e["node"] == node and e["event"] == "gpu" and " isolated: " in e["detail"]
    )
    return {
        "blocked_s": first(lambda e: e["node"] == node and e["event"] == "block"),
        "job_resumed_s": resumed,
        "back_in_service_s": back,
        "gpu_isolated_s": isolated,
        "gpus_out": gpus_out,
        "restart_phases": restart_phases(timeline, node),
    }


# The phases of a gang restart, in order, each the seconds from the previous one's end to
# this milestone (the first from the fault); docs/lab.md names each event.
PHASES = ("detect", "stop", "reschedule", "process_start", "rendezvous", "restore", "first_step")


def restart_phases(timeline: list[dict[str, Any]], node: str) -> dict[str, float | None] | None:
    """Seconds each phase of the fault's first gang restart took, measured between events of
    the timeline; None when the fault caused no restart. A phase whose end (or start) no
    event marks is None, never guessed. Milestones:
    - detect: the broken node blocked (gpuvigil's taint), or training's hang event;
    - stop: every pod of the old attempt ended (the lab's job.attempt, written once they
      are all gone, starts the next attempt); in-process mode, the lost rank's pod ended
      (job.pod_replaced: its replacement created, the other pods untouched);
    - reschedule: the last of the new attempt's pods bound to a node (job.pod_scheduled);
    - process_start: a new process reached training.init (startup's init_ts: rank 0's,
      or the replacement's; a survivor's own init_ts, when it lost its peer, comes before);
    - rendezvous: its process group formed (group_ts);
    - restore: the checkpoint restored (restored_ts);
    - first_step: the first step after the restore done (startup's own time)."""
    after = [e for e in timeline if e["t_s"] >= 0]
    attempt = next(
        (i for i, e in enumerate(after) if e["event"] in ("job.attempt", "job.pod_replaced")), None
    )
    if attempt is None:
        return None
    before, since = after[:attempt], after[attempt:]

    def at(events: list[dict[str, Any]], *names: str, on: str | None = None) -> float | None:
        return next(
            (e["t_s"] for e in events if e["event"] in names and (on is None or e["node"] == on)),
            None,
        )

    detect = at([e for e in before if e["event"] == "block" and e["node"] == node]
                or [e for e in before if e["event"] == "hang"], "block", "hang")  # fmt: skip
    first_step = at(since, "first_step")
    ready = [e for e in since if first_step is None or e["t_s"] <= first_step]
    scheduled = [
        e["t_s"] for e in since if e["event"] == "job.pod_scheduled"
        and (first_step is None or e["t_s"] <= first_step)
    ]  # fmt: skip
    ends = [
        detect,
        since[0]["t_s"],
        max(scheduled) if scheduled else None,
        at(ready, "worker_start"),
        at(ready, "rendezvous"),
        at(ready, "restored"),
        first_step,
    ]
    out: dict[str, float | None] = {}
    start: float | None = 0.0
    for name, end in zip(PHASES, ends, strict=True):
        out[name] = None if start is None or end is None else round(end - start, 2)
        start = end
    return out


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


def ettr_of(report: dict[str, Any]) -> float | None:
    """The job's ETTR as `gpuvigil report` computed it from the fault's own events
    (`slo.ettr`: productive step time over wall time since the job started); None when the
    report has none (no job, or the report failed)."""
    ratio = ((report.get("slo") or {}).get("ettr") or {}).get("ratio")
    return float(ratio) if isinstance(ratio, int | float) else None


def job_record(job: GangJob, lost_steps: list[int]) -> dict[str, Any]:
    """The `job` field: the gang's outcome, the steps lost as training reported them, and
    each rank's pods (`ranks`): `survivors`, the ranks whose first pod ran to the end, never
    stopped or replaced; `restarted`, the ranks that got a new pod; `moved`, each new pod on
    another node than its rank's pod before, from which node to which (and whether that
    node was a hot spare when the pod was bound to it)."""
    ranks = job.ranks_record()
    moved = []
    for r in ranks:
        for old, new in itertools.pairwise(r["pods"]):
            if new["node"] != old["node"]:
                moved.append({"rank": r["rank"], "from": old["node"], "to": new["node"],
                              "to_spare": new["on_spare"], "pod": new["pod"]})  # fmt: skip
    return {
        "finished": job.state == "Succeeded",
        "state": job.state,
        "mode": job.mode,
        "restarts": len(job.attempts) - 1,
        "lost_steps": sum(lost_steps) if lost_steps else None,
        "exit_codes": job.exit_codes(),
        "attempts": [
            {
                "attempt": a.number,
                "nodes": sorted(a.nodes.values()),
                "exit_codes": a.exit_codes,
                "policy": a.failed,
            }
            for a in job.attempts
        ],
        "backoff_counted": job.counted,
        "ranks": ranks,
        "survivors": [r["rank"] for r in ranks if r["kept"]],
        "restarted": [r["rank"] for r in ranks if len(r["pods"]) > 1],
        "moved": moved,
    }


def log_offsets(events: Path) -> dict[str, int]:
    """Where each event log ends now: the next fault's events begin there."""
    return {p.name: p.stat().st_size for p in events.glob("*.jsonl")}


def slice_logs(events: Path, offsets: dict[str, int], dest: Path) -> Path:
    """Copy what each event log gained since `offsets` (whole lines) into `dest`: one
    fault's own event logs, for `gpuvigil report`."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(events.glob("*.jsonl")):
        with path.open("rb") as fh:
            fh.seek(offsets.get(path.name, 0))
            data = fh.read()
        (dest / path.name).write_bytes(data[: data.rfind(b"\n") + 1])
    return dest
