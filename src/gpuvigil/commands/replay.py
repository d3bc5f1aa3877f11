"""`gpuvigil replay`: what a controller policy would have done with recorded history."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvigil.core.cli_exit import CliExit


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay(
        inputs: Annotated[
            list[Path],
            typer.Argument(
                help="An event log (JSONL) or kernel logs, one file per node "
                "named after it (node-17.log -> node-17).",
                exists=True,
                dir_okay=False,
            ),
        ],
        *,
        policy: Annotated[
            Path | None,
            typer.Option(
                help="A gpuvigil config file; its controller: section is the policy "
                "(and node.kernel_log its Xid catalog changes).",
                exists=True,
                dir_okay=False,
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
        limit: Annotated[int, typer.Option(help="Decisions to list (0: all).")] = 40,
        show_all: Annotated[bool, typer.Option("--all", help="List every decision.")] = False,
    ) -> None:
        """Run recorded history through a remediation policy in dry run: every state change,
        remediation step and hold the controller would have made, and why.

        Given an event log that holds the controller's own decisions, it also compares
        them: what it predicts against what was recorded, and for each node where the
        steps differ, why (budget, timing or policy).

        Example: gpuvigil replay events.jsonl --policy my-policy.yaml
        """
        from gpuvigil import config as config_mod
        from gpuvigil.observe import events as reader
        from gpuvigil.observe import terminal
        from gpuvigil.sim import replay as sim_replay
        from gpuvigil.sim import replay_diff

        try:
            cfg = config_mod.load(policy, sections=("node", "controller"))
        except config_mod.ConfigError as e:
            typer.echo(f"gpuvigil replay: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        empty = [str(p) for p in inputs if not p.read_bytes().strip()]
        if empty:
            typer.echo(f"gpuvigil replay: {', '.join(empty)}: empty, nothing to replay", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL)
        events = all(sim_replay.is_event_log(p) for p in inputs)
        fleet = sim_replay.fleet_from_events(inputs) if events else 0
        with terminal.progress(quiet=as_json) as progress:
            progress("reading the history", None)
            if events:
                changes = list(sim_replay.changes_from_events(inputs))
            else:
                changes = list(sim_replay.changes_from_kernel_logs(inputs, config=cfg.node))
            if events and not changes and not fleet:
                typer.echo(
                    "gpuvigil replay: no node and no health change in the event log "
                    f"{', '.join(map(str, inputs))}: nothing to replay",
                    err=True,
                )
                raise typer.Exit(CliExit.CANNOT_TELL)
            progress(f"replaying {len(changes):,} changes", None)
            result = sim_replay.replay(
                changes, controller=cfg.controller, steps_work=not events, fleet=fleet
            )
        comparison = None
        if events:
            log = list(reader.read_events([str(p) for p in inputs]))
            recorded = replay_diff.recorded(log)
            if recorded:
                comparison = replay_diff.compare(result.decisions, recorded, log)
        if as_json:
            out = result.to_json()
            if comparison is not None:
                out["compared_with_the_log"] = comparison.to_json()
            typer.echo(json.dumps(out, indent=2, default=str))
            return
        _print(result, comparison, limit=0 if show_all else limit, fleet=fleet)


def _print(result: Any, comparison: Any, *, limit: int, fleet: int) -> None:
    from gpuvigil.observe import terminal
    from gpuvigil.observe.terminal import Column, plain
    from gpuvigil.sim.replay_diff import REASONS

    console = terminal.console()
    r = result  # sim.replay.Replay
    size = f" of a {fleet:,}-node fleet" if fleet > r.nodes else ""
    console.print(plain(f"{r.nodes} nodes{size}, {r.changes} changes of their health replayed"))
    cols = (
        Column("time (UTC)", key=True, wrap=False),
        Column("node", key=True),
        Column("event"),
        Column("detail"),
    )
    shown = r.decisions if not limit else r.decisions[:limit]
    rows = []
    for d in shown:
        when = datetime.fromtimestamp(d["ts"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        if d["kind"] == "node.state":
            what = f"-> {d.get('to')}"
        elif d["kind"] == "breaker":
            what = f"breaker {d.get('state')}"
        else:
            what = f"{d.get('action')} {d.get('result')}"
        rows.append(
            [
                when,
                plain(str(d.get("node") or "fleet")),
                plain(what),
                plain(str(d.get("reason", ""))),
            ]
        )
    terminal.print_table(
        console,
        cols,
        rows,
        title="what the controller would have done",
        total=len(r.decisions),
        noun="decisions",
        see_all="--all lists every one, --json prints them all",
    )
    counts = r.counts()
    console.print(
        plain("totals: " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "nothing"))
    )
    if comparison is None:
        return
    c = comparison
    rows = [
        [
            plain(k),
            f"{c.predicted.get(k, 0):,}",
            f"{c.recorded.get(k, 0):,}",
            f"{c.predicted.get(k, 0) - c.recorded.get(k, 0):+,}",
        ]
        for k in c.keys
    ]
    cols = (
        Column("decision", key=True),
        Column("predicted", justify="right"),
        Column("recorded", justify="right"),
        Column("difference", justify="right"),
    )
    console.print(
        terminal.render(
            cols,
            rows,
            width=console.width,
            title="predicted against the controller's recorded decisions",
        )
    )
    if not c.nodes:
        console.print("every node got the same remediation steps as recorded")
        return
    why = ", ".join(f"{n} {cause}" for cause, n in c.by_cause().most_common())
    console.print(plain(f"{len(c.nodes)} nodes got different steps: {why}"))
    for cause, text in REASONS.items():
        if cause in c.by_cause():
            console.print(plain(f"  {cause}: {text}"))
    cols = (
        Column("node", key=True),
        Column("predicted"),
        Column("recorded"),
        Column("why"),
        Column("detail"),
    )
    shown_nodes = c.nodes if not limit else c.nodes[:limit]
    rows = [
        [
            plain(n.node),
            plain(" ".join(n.predicted) or "-"),
            plain(" ".join(n.recorded) or "-"),
            n.why,
            plain(n.detail),
        ]
        for n in shown_nodes
    ]
    terminal.print_table(
        console,
        cols,
        rows,
        title="nodes whose steps differ",
        total=len(c.nodes),
        noun="nodes",
        see_all="--all lists every one, --json prints them all",
    )
