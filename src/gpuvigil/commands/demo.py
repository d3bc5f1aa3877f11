"""`gpuvigil demo` (what `make demo` runs): the fleet simulator's default comparison, with a
progress bar, the scenario table, and layer 4's HTML report of the `full` run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DEMO_NODES = 512  # 512 nodes x 30 days: every scenario plus the storm in ~10 s on 2 cores


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        *,
        nodes: Annotated[int, typer.Option(help="Simulated nodes (8 GPUs each).")] = DEMO_NODES,
        days: Annotated[float, typer.Option(help="Simulated days.")] = 30.0,
        seed: Annotated[int, typer.Option(help="Same seed, same numbers.")] = 1,
        report: Annotated[
            Path, typer.Option(help="Where to write the HTML report of the full run.")
        ] = Path("out/gpuvigil-demo-report.html"),
        events: Annotated[
            Path | None, typer.Option(help="Also write the full run's events (JSONL) here.")
        ] = None,
        as_json: Annotated[
            bool,
            typer.Option("--json", help="Print the runs' figures as JSON (as simulate --json)."),
        ] = False,
    ) -> None:
        """Simulate a GPU fleet with and without gpuvigil, print what each layer buys, and
        write the HTML report of the run with every layer on. No GPU needed.

        Runs the real node rules, controller policy and safety, restart semantics and
        SLO/attribution code against faults at the Llama 3 paper's published rates. Shows
        GPU-hours kept by per-GPU isolation and serving minutes below demand with (`full`)
        and without (`platform`) per-GPU isolation and the capacity gate.
        """
        from gpuvigil.sim import demo as sim_demo

        path = sim_demo.run(
            nodes=nodes, days=days, seed=seed, report=report, events=events, as_json=as_json
        )
        typer.echo(f"HTML report of the full run: {path.resolve()}", err=as_json)
