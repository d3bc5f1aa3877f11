"""`gpuvigil release NODE`: end a quarantine; the node validates before it takes work."""

from __future__ import annotations

import getpass
from pathlib import Path

import typer

from gpuvigil.commands.controller import (
    CLUSTER_HELP,
    CONFIG_OPTION,
    CONTEXT_OPTION,
    KUBECONFIG_OPTION,
    cluster_overrides,
    load_controller_config,
    open_or_exit,
)
from gpuvigil.core.cli_exit import CliExit

CONFLICT_TRIES = 5  # re-reads of a Node another writer changed between read and store


def register(app: typer.Typer) -> None:
    @app.command("release")
    def release_cmd(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        name: str = typer.Argument(..., help="The node to release."),
        cluster: str = typer.Option(None, "--cluster", help=CLUSTER_HELP),
        config: Path = CONFIG_OPTION,
        kubeconfig: Path = KUBECONFIG_OPTION,
        context: str = CONTEXT_OPTION,
        by: str = typer.Option(None, "--by", help="Who releases it (default: your user name)."),
        force: bool = typer.Option(
            False, "--force", help="Also restart a node that is not QUARANTINED from VALIDATING."
        ),
    ) -> None:
        """Release a QUARANTINED node: gpuvigil ends this episode's ladder and moves it to
        VALIDATING; it returns to service when preflight passes (and a fresh health summary
        is clean). Nothing is wiped: the machine's episodes stay, the last marked with who
        released it, so a machine that keeps failing is still replaced as a lemon. On
        Kubernetes it also writes gpuvigil.io/released-at, so the node's agent forgets the
        REPLACE/INVESTIGATE Xid events it kept across reboots. Exit 1 when the node is not
        quarantined (use --force)."""
        from gpuvigil.core.findings import utcnow
        from gpuvigil.platform.clusters.base import ClusterError, Conflict, NotFound
        from gpuvigil.platform.policy import release
        from gpuvigil.platform.state import State

        cfg = load_controller_config(
            config, cluster_overrides(cluster, kubeconfig, context)
        ).controller
        adapter = open_or_exit(cfg)
        who = by or getpass.getuser()
        try:
            # Read, decide, store only if the Node is unchanged since the read: the agent
            # and the controller write it too, so a conflict means read it again and decide
            # again on what is there now (a 409 ended the release before).
            for attempt in range(1, CONFLICT_TRIES + 1):
                v = adapter.get_node(name)
                state = v.record.state if v.record else State.HEALTHY
                if state is not State.QUARANTINED and not force:
                    typer.echo(
                        f"{name} is {state.value}, not QUARANTINED (--force to revalidate)",
                        err=True,
                    )
                    raise typer.Exit(CliExit.FAILED)
                now = utcnow()
                rec = release(v.record, now=now, who=who)
                try:
                    adapter.store(name, rec, version=v.version)
                    break
                except Conflict:
                    if attempt == CONFLICT_TRIES:
                        raise
            adapter.block(name, reason=rec.tag())  # stays off work until it validates
            # The agent forgets the REPLACE/INVESTIGATE Xid events it kept across reboots.
            adapter.mark_released(name, at=now)
            adapter.record_event(
                name,
                reason="gpuvigilReleased",
                message=f"released by {who}: validating before work",
            )
        except NotFound as e:
            typer.echo(f"no node named {name!r} in the {cfg.cluster} cluster", err=True)
            raise typer.Exit(CliExit.FAILED) from e
        except ClusterError as e:
            typer.echo(f"cannot release {name}: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        typer.echo(f"{name}: {state.value} -> VALIDATING (released by {who})")
