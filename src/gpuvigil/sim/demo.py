"""`gpuvigil demo`: every scenario and the storm with a progress bar, the table, the report.

The HTML report shows the runs' figures (`Results.figures`, the table's numbers) and then
layer 4's report of the `full` run's events, each part saying which measure it shows.
"""

from __future__ import annotations

from pathlib import Path

from gpuvigil.sim import cli
from gpuvigil.sim.record import EventRecorder


def run(*, nodes: int, days: float, seed: int, report: Path, events: Path | None) -> Path:
    from gpuvigil.observe import terminal
    from gpuvigil.observe.html import render_html

    full = EventRecorder(write_to=events)
    with terminal.progress() as progress:
        results = cli.run_all(nodes=nodes, days=days, seed=seed, progress=progress,
                              recorders={"full": full})  # fmt: skip
    cli.print_results(results)
    report.parent.mkdir(parents=True, exist_ok=True)
    runs = {name: r.figures() for name, r in results.items()}
    report.write_text(render_html(full.report, runs=runs, main="full"), encoding="utf-8")
    return report
