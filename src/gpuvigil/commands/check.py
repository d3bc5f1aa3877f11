"""`gpuvigil check`: every node check here, once; a table or the NodeReport as JSON.

Exit 0 healthy, 1 unhealthy (a definite failure wins), 2 a check could not run (so a node
without its NVIDIA driver that should have GPUs exits non-zero, saying so; `--expect-gpus
0` checks the rest).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpuvigil import config as config_mod
from gpuvigil.commands import report_view
from gpuvigil.core.cli_exit import CliExit
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.gpu.readings import GpuInventory
from gpuvigil.node.sweep import run_sweep, select
from gpuvigil.observe import terminal


def register(app: typer.Typer) -> None:
    @app.command("check")
    def check(  # noqa: PLR0917 - typer maps every option to a parameter
        config: Annotated[
            Path | None,
            typer.Option("--config", help="YAML config file (the `node:` section applies here)."),
        ] = None,
        as_json: bool = typer.Option(
            False, "--json", help="Print the NodeReport as JSON (stable, see docs/checks.md)."
        ),
        expect_gpus: int | None = typer.Option(
            None,
            "--expect-gpus",
            min=0,
            help="GPUs this node must have (overrides node.expect_gpus and the instance "
            "catalog). 0: a node without GPUs; the other checks still run.",
        ),
        sysfs_root: Annotated[
            Path | None,
            typer.Option(
                "--sysfs-root",
                help="Read sysfs and /dev below this folder instead of / (a captured tree).",
            ),
        ] = None,
        node: str | None = typer.Option(None, "--node", help="Node name in the report."),
        skip: Annotated[
            list[str] | None,
            typer.Option(
                "--skip",
                help="Do not run this check (repeatable), e.g. --skip dcgm_diag. A skipped "
                "check is reported as disabled, never as passed.",
            ),
        ] = None,
    ) -> None:
        """Run every node health check here once (GPUs, DCGM, kernel log, fabric, PCIe).

        Exit status: 0 healthy, 1 unhealthy (even when another check could not run), 2 a
        check could not run and nothing else failed. A check that cannot
        run (missing tool, timeout, crash) is a failure, never a pass.
        """
        overrides = {"node": {"expect_gpus": expect_gpus}} if expect_gpus is not None else None
        try:
            cfg = config_mod.load(config, overrides=overrides, sections=("node",))
        except config_mod.ConfigError as e:
            typer.echo(f"gpuvigil check: config error: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        ctx = CheckContext(config=cfg.node, root=sysfs_root or Path("/"))
        specs = select()
        unknown = sorted(set(skip or ()) - {s.name for s in specs})
        if unknown:
            names = ", ".join(s.name for s in specs)
            typer.echo(f"gpuvigil check: no check named {', '.join(unknown)} ({names})", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL)
        with terminal.progress(quiet=as_json) as progress:  # a DCGM diag takes minutes
            progress(f"running {len(specs) - len(set(skip or ()))} node checks", None)
            report = run_sweep(ctx, node=node, specs=specs, skipped=skip or ())
        if as_json:
            sys.stdout.write(report_view.as_json(report) + "\n")
        else:
            inv = ctx.facts.get(GpuInventory)
            if inv is not None:
                typer.echo(report_view.inventory_line(inv))
            report_view.render(
                report, console=Console(emoji=False, highlight=False), title="gpuvigil check"
            )
        raise typer.Exit(report.exit_code())
