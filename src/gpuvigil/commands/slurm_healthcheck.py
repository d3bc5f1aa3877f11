"""`gpuvigil slurm-healthcheck`: not implemented yet (see the open issues)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("slurm-healthcheck", hidden=True)
    def _todo() -> None:
        """Not implemented yet."""
        typer.echo("gpuvigil slurm-healthcheck: not implemented yet", err=True)
        raise typer.Exit(2)
