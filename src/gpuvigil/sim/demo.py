"""`gpuvigil demo`: every scenario and the storm with a progress bar, the table, the report.

The HTML report shows the runs' figures (`Results.figures`, the table's numbers) and then
layer 4's report of the `full` run's events, each part saying which measure it shows.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuvigil.sim import cli
from gpuvigil.sim.record import EventRecorder


def run(
    *, nodes: int, days: float, seed: int, report: Path, events: Path | None,
    as_json: bool = False,
) -> Path:  # fmt: skip
    from gpuvigil.observe import terminal
    from gpuvigil.observe.html import render_html

    full = EventRecorder(write_to=events)
    with terminal.progress(quiet=as_json) as progress:
        results = cli.run_all(nodes=nodes, days=days, seed=seed, progress=progress,
                              recorders={"full": full})  # fmt: skip
    if as_json:
        print(json.dumps({k: r.to_json() for k, r in results.items()}, indent=2))
    else:
        cli.print_results(results)
    report.parent.mkdir(parents=True, exist_ok=True)
    runs = {name: r.figures() for name, r in results.items()}
    html = render_html(full.report, runs=runs, main="full", panels=[truth_panel(full)])
    report.write_text(html, encoding="utf-8")
    return report


# Why layer 4 finds no evidence for some restarts: what the simulated world did that no
# gpuvigil component writes an event about (keyed by the restart's cause in the simulator).
NO_EVIDENCE = {
    "host_maintenance": "the host went down: its agent fell silent and the cloud's instance "
    "check rebooted it; no gpuvigil event names the fault",
    "host_failure": "the host died: its agent fell silent and the cloud replaced it; no "
    "gpuvigil event names the fault",
    "drain: human": "a person drained a quarantined node to repair it; a person's drain "
    "writes no gpuvigil event",
    "sdc": "silent corruption: the job noticed wrong results before any check saw the GPU",
    "nccl_hang": "a hung collective ended by its timeout, which writes no gpuvigil event",
}


def truth_panel(rec: EventRecorder) -> tuple[str, list[str], list[list[str]], str]:
    """Layer 4's attribution of each restart against what caused it in the simulation."""
    from collections import Counter

    truth = {(e.job, e.ts): str(e.data.get("reason", "")) for e in rec.events
             if e.kind == "job.restart"}  # fmt: skip
    pairs = Counter(
        (a.cause, truth.get((a.job, a.ts), "?")) for a in rec.report.attribution.attributions
    )
    rows = [
        [cause, what, str(n), NO_EVIDENCE.get(what, "") if cause == "unknown" else ""]
        for (cause, what), n in sorted(pairs.items(), key=lambda x: (x[0][0], -x[1]))
    ]
    note = ("The simulator knows what caused each restart; layer 4 only sees the event log. "
            "Every 'unknown' row says what left no evidence.")  # fmt: skip
    return ("Attribution against the simulation's ground truth",
            ["layer 4's cause", "what happened (simulator)", "restarts", "why no evidence"],
            rows, note)  # fmt: skip
