"""`gpuvigil simulate`: the fleet simulator, scenario by scenario (see docs/simulator.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gpuvigil.core.cli_exit import CliExit

SCENARIO_HELP = (
    "baseline | node | platform | full | storm+breaker | storm-no-breaker | "
    "driver-storm+breaker | driver-storm-no-breaker | pool-rollout | silence | split-brain | "
    "api-outage | all (default: all; the fleet events unless --no-storm)."
)


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        *,
        scenario: Annotated[str, typer.Option(help=SCENARIO_HELP)] = "all",
        nodes: Annotated[
            int | None, typer.Option(help="Nodes (8 GPUs each); default 1,024.")
        ] = None,
        days: Annotated[
            float | None, typer.Option(help="Simulated days; default 30 (llama3: 54).")
        ] = None,
        seed: Annotated[int, typer.Option(help="Same seed, same numbers.")] = 1,
        workload: Annotated[
            str,
            typer.Option(
                help="mixed (jobs of 1-256 nodes; a quarter of the nodes serve an always-on "
                "inference Deployment) | llama3 (one 2,048-node job)."
            ),
        ] = "mixed",
        storm: Annotated[
            bool,
            typer.Option(
                help="Also run the fleet going wrong: a missing tool and a bad driver with and "
                "without the circuit breaker, a bad driver on one pool, every agent silent 2 h."
            ),
        ] = True,
        policy: Annotated[
            Path | None,
            typer.Option(
                help="A gpuvigil config file: its controller: (and node:) sections run next to "
                "the defaults, as <scenario>+policy.",
                exists=True,
                dir_okay=False,
            ),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print JSON keyed by run name.")
        ] = False,
    ) -> None:
        """Simulate a GPU fleet with and without gpuvigil's layers and print what each buys.

        Runs the real node rules, controller policy and safety, restart semantics and
        SLO/attribution code against simulated hardware faults at published rates.
        `platform` runs the controller with the whole-node ladder only; `full` adds per-GPU
        isolation and the serving capacity gate (gpu_hours_kept_by_isolation,
        serving_minutes_below_demand in --json).
        Example: gpuvigil simulate --nodes 256 --days 14 --json
        """
        from gpuvigil import config as config_mod
        from gpuvigil.observe import terminal
        from gpuvigil.sim import cli

        try:
            user = (
                config_mod.load(policy, sections=("node", "controller"))
                if policy is not None
                else None
            )
            with terminal.progress(quiet=as_json) as progress:
                results = cli.run_all(
                    scenario=scenario, nodes=nodes, days=days, seed=seed, workload=workload,
                    storm=storm, policy=user.controller if user else None,
                    node_config=user.node if user and "node" in user.model_fields_set else None,
                    progress=progress,
                )  # fmt: skip
        except (cli.UsageError, config_mod.ConfigError) as e:
            typer.echo(f"gpuvigil simulate: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        if as_json:
            typer.echo(json.dumps({k: r.to_json() for k, r in results.items()}, indent=2))
            return
        cli.print_results(results)
