"""The `gpuvigil` command: one entry point, one module per subcommand in `commands/`.

Nothing here registers metrics or reads the environment at import; each command composes
what it needs when it runs.
"""

from __future__ import annotations

import typer

from gpuvigil import __version__
from gpuvigil.commands import (
    agent,
    analyze,
    check,
    controller,
    demo,
    lab,
    logscan,
    nodes,
    npd,
    preflight,
    release,
    replay,
    report,
    simulate,
    slurm_healthcheck,
)

app = typer.Typer(
    name="gpuvigil",
    help=(
        "Keeps GPU fleets fit for gang training: fail-closed node checks (check, analyze, "
        "logscan, agent, preflight), safe remediation (controller, nodes, release), and the "
        "numbers that prove it (report, simulate, demo, lab)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (
    check,
    analyze,
    logscan,
    agent,
    npd,
    slurm_healthcheck,
    preflight,
    controller,
    nodes,
    release,
    report,
    simulate,
    replay,
    demo,
    lab,
):
    module.register(app)


@app.command("version")
def version() -> None:
    """Print gpuvigil's version."""
    typer.echo(__version__)


def main() -> None:
    app()
