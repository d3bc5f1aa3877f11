"""`gpuvigil demo`: every scenario and the storm with a progress bar, the table, the report."""

from __future__ import annotations

from pathlib import Path

from gpuvigil.sim import cli
from gpuvigil.sim.record import EventRecorder


def run(*, nodes: int, days: float, seed: int, report: Path, events: Path | None) -> Path:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gpuvigil.observe.html import render_html

    console = Console(stderr=True)
    full = EventRecorder(write_to=events)
    columns = (TextColumn("[bold]{task.description:<18}"), BarColumn(),
               TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, fraction: float) -> None:
            if name not in tasks:
                for done in tasks.values():  # runs go one after the other
                    bar.update(done, completed=1.0)
                tasks[name] = bar.add_task(name, total=1.0)
            bar.update(tasks[name], completed=min(1.0, fraction))

        results = cli.run_all(nodes=nodes, days=days, seed=seed, progress=progress,
                              recorders={"full": full})  # fmt: skip
        for task in tasks.values():
            bar.update(task, completed=1.0)
    cli.print_results(results)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(render_html(full.report), encoding="utf-8")
    return report
