"""`gpuvigil replay`: what a controller policy would have done with recorded history."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer


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
    ) -> None:
        """Run recorded history through a remediation policy in dry run: every state change,
        remediation step and hold the controller would have made, and why.

        Example: gpuvigil replay events.jsonl --policy my-policy.yaml
        """
        from gpuvigil import config as config_mod
        from gpuvigil.sim import replay as sim_replay

        try:
            cfg = config_mod.load(policy)
        except config_mod.ConfigError as e:
            typer.echo(f"gpuvigil replay: {e}", err=True)
            raise typer.Exit(2) from e
        events = all(sim_replay.is_event_log(p) for p in inputs)
        if events:
            changes = sim_replay.changes_from_events(inputs)
        else:
            changes = sim_replay.changes_from_kernel_logs(inputs, config=cfg.node)
        result = sim_replay.replay(changes, controller=cfg.controller, steps_work=not events)
        if as_json:
            typer.echo(json.dumps(result.to_json(), indent=2, default=str))
            return
        _print(result, limit=limit)


def _print(result: object, *, limit: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if Console().is_terminal else 120)
    r = result  # sim.replay.Replay
    console.print(f"{r.nodes} nodes, {r.changes} changes of their health replayed")  # type: ignore[attr-defined]
    t = Table(title="what the controller would have done")
    for col in ("time (UTC)", "node", "event", "detail"):
        t.add_column(col)
    rows = r.decisions if not limit else r.decisions[:limit]  # type: ignore[attr-defined]
    for d in rows:
        when = datetime.fromtimestamp(d["ts"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        if d["kind"] == "node.state":
            what, detail = f"-> {d.get('to')}", d.get("reason", "")
        elif d["kind"] == "breaker":
            what, detail = f"breaker {d.get('state')}", d.get("reason", "")
        else:
            what, detail = f"{d.get('action')} {d.get('result')}", d.get("reason", "")
        t.add_row(when, str(d.get("node") or "fleet"), what, str(detail)[:70])
    console.print(t)
    counts = r.counts()  # type: ignore[attr-defined]
    console.print("totals: " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "nothing"))
