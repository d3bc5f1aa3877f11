"""`gpuvigil explain NODE`: one node's story in time order, from its API object (the record's
history, the controller's published decision, the agent's summary) and the event logs."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from gpuvigil.core.events import Event
    from gpuvigil.platform.state import NodeView

EVENTS_OPTION = typer.Option(
    None,
    "--events",
    help="An event log (JSONL) to read; repeatable. Default: the controller's events_path "
    "when that file is here.",
)
Line = tuple[float, str, str]  # (seconds since the epoch, source, what happened)


def _event_line(e: Event) -> str:
    d = e.data
    if e.kind == "node.state":
        verb = "would move" if d.get("dry_run") else "moved"
        if d.get("from") is None:
            return f"observed in {d.get('to')}"
        return f"{verb} {d.get('from')} -> {d.get('to')}: {d.get('reason', '')}"
    if e.kind == "remediation":
        if d.get("result") == "skipped":
            return str(d.get("reason", ""))
        return f"{d.get('action')} {d.get('result')}: {d.get('reason', '')}".rstrip(": ")
    if e.kind in ("finding.set", "finding.cleared"):
        verb = "found" if e.kind == "finding.set" else "cleared"
        return f"{verb} {d.get('code')} {d.get('component', '')}: {d.get('message', '')}".rstrip(
            ": "
        )
    if e.kind == "breaker":
        return f"circuit breaker {d.get('state')}: {d.get('reason', '')}"
    rest = ", ".join(f"{k}={v}" for k, v in sorted(d.items()))
    return f"{e.kind} {rest}".strip()


def story(view: NodeView | None, events: Iterable[Event], *, node: str) -> list[Line]:
    """The node's story: every event about it (and the breaker's, which hold it), the
    record's transitions the event logs do not already tell, the agent's latest summary
    and the controller's latest decision; in time order."""
    lines: list[Line] = []
    told: set[tuple[int, str]] = set()  # (second, state) transitions the logs tell
    for e in events:
        if e.node != node and not (e.kind == "breaker" and e.node is None):
            continue
        if e.kind == "node.state" and e.data.get("from") is not None:
            told.add((int(e.ts), str(e.data.get("to"))))
        lines.append((e.ts, e.source, _event_line(e)))
    if view is not None:
        rec = view.intent.record if view.intent and view.intent.record else view.record
        dry = " (dry run)" if view.intent and view.intent.record else ""
        for t in rec.history if rec else ():
            if (int(t.at.timestamp()), t.to.value) not in told:
                lines.append((t.at.timestamp(), f"record{dry}", f"-> {t.to.value}: {t.reason}"))
        if view.health is not None:
            bad = [f"{f.status.value} {f.code} {f.component}" for f in view.health.findings]
            what = "reports " + (", ".join(bad) if bad else "healthy")
            lines.append((view.health.generated_at.timestamp(), "agent", what))
        if view.intent is not None:
            i = view.intent
            what = f"decided {i.state.value}: {i.reason}"
            what += f"; next: {i.next}" if i.next else ""
            what += f"; held ({i.held_by}): {i.held}" if i.held else ""
            src = "controller (dry run)" if i.dry_run else "controller"
            lines.append((i.at.timestamp(), src, what))
    lines.sort(key=lambda x: x[0])
    return lines


def register(app: typer.Typer) -> None:
    @app.command("explain")
    def explain(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        name: str = typer.Argument(..., help="The node whose story to tell."),
        events: list[Path] = EVENTS_OPTION,
        cluster: str = typer.Option(None, "--cluster", help=CLUSTER_HELP),
        config: Path = CONFIG_OPTION,
        kubeconfig: Path = KUBECONFIG_OPTION,
        context: str = CONTEXT_OPTION,
        no_cluster: bool = typer.Option(
            False, "--no-cluster", help="Tell it from the event logs alone (a post-mortem)."
        ),
        as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
    ) -> None:
        """Tell one node's story in time order: what the agent found, what the controller
        decided (or, in dry run, would have) and why, from the event logs and the node's
        API object.

        Each step, hold and breaker change from the event logs; the record's history, the
        controller's latest decision and the agent's latest summary from the node.

          gpuvigil explain gpu-017
          gpuvigil explain gpu-017 --events /var/log/gpuvigil/controller.jsonl
          gpuvigil explain gpu-017 --no-cluster --events events.jsonl --json

        Exit 1 when nothing at all is known about the node."""
        from gpuvigil.observe.events import read_events
        from gpuvigil.platform.clusters.base import ClusterError, NotFound

        cfg = load_controller_config(
            config, cluster_overrides(cluster, kubeconfig, context)
        ).controller
        paths = list(events or [])
        if not paths and cfg.events_path is not None and Path(cfg.events_path).exists():
            paths = [Path(cfg.events_path)]
        view = None
        if not no_cluster:
            adapter = open_or_exit(cfg)
            try:
                view = adapter.get_node(name)
            except NotFound:
                view = None  # gone from the cluster: the logs may still tell
            except ClusterError as e:
                typer.echo(f"cannot read node {name}: {e}", err=True)
                raise typer.Exit(CliExit.CANNOT_TELL) from e

        def warn(msg: str) -> None:
            typer.echo(msg, err=True)

        lines = story(view, read_events(paths, warn=warn), node=name)
        if not lines and view is None:
            typer.echo(f"nothing known about node {name!r}", err=True)
            raise typer.Exit(CliExit.FAILED)
        for ts, src, what in lines:
            at = datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")
            if as_json:
                typer.echo(json.dumps({"at": at, "source": src, "what": what}))
            else:
                typer.echo(f"{at}  {src:<20}  {what}")
