"""`gpuvigil release`: not implemented yet (see the open issues)."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("release", hidden=True)
    def _todo() -> None:
        """Not implemented yet."""
        typer.echo("gpuvigil release: not implemented yet", err=True)
        raise typer.Exit(2)
