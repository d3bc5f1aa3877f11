"""`gpuvigil nodes`: each node's remediation state, why, and its recent history."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from gpuvigil.platform.state import NodeView


def _ago(t: datetime | None, now: datetime) -> str:
    if t is None:
        return "-"
    s = int((now - t).total_seconds())
    return f"{s // 86400}d" if s >= 86400 else f"{s // 3600}h" if s >= 3600 else f"{s // 60}m"


def _since(row: dict[str, Any]) -> datetime | None:
    return datetime.fromisoformat(row["since"]) if row["since"] else None


def node_row(v: NodeView) -> dict[str, Any]:
    """One node as `gpuvigil nodes --json` prints it. Where a dry-run controller published
    its decision, `state`, `reason`, `history` are those of the record it would have
    stored (what the live controller would have done), `stored_state` what is really on
    the node, and `dry_run` is true."""
    from gpuvigil.platform.state import State

    intent = v.intent
    dry = intent is not None and intent.dry_run and intent.record is not None
    rec = intent.record if dry and intent is not None else v.record
    blocked = (["gpuvigil"] if v.blocked_by_us else []) + list(v.blocked_by_others)
    decision = None
    if intent is not None:
        decision = {"at": intent.at.isoformat(), "state": intent.state.value,
                    "reason": intent.reason, "next": intent.next, "held": intent.held,
                    "held_by": intent.held_by, "dry_run": intent.dry_run}  # fmt: skip
    return {
        "node": v.name,
        "state": rec.state.value if rec else State.HEALTHY.value,
        "since": rec.since.isoformat() if rec and rec.since else None,
        "reason": rec.reason if rec else "",
        "step": rec.step.value if rec and rec.step else None,
        "failures": rec.failures if rec else 0,
        "dry_run": dry,
        "stored_state": v.record.state.value if v.record else State.HEALTHY.value,
        "decision": decision,
        "next": intent.next if intent else "",
        "held": intent.held if intent else "",
        "held_by": intent.held_by if intent else "",
        "blocked_by": blocked,
        "running": v.running,
        "spare": v.spare,  # a hot spare, kept idle for gang jobs' lost ranks
        "health": v.health.status.value if v.health else (v.health_error or "absent"),
        "history": [
            {"at": t.at.isoformat(), "to": t.to.value, "reason": t.reason}
            for t in (rec.history if rec else ())
        ],
        # the machine's memory (kept across release, reboot and rename)
        "machine": (rec.machine if rec else "") or v.provider_id,
        "episodes": [
            {"start": e.start.isoformat(), "end": e.end.isoformat(), "codes": list(e.codes),
             "steps": [a.value for a in e.steps], "outcome": e.outcome,
             "released_by": e.released_by, "gpu": e.gpu}
            for e in (rec.episodes if rec else ())
        ],
        # the one GPU out of service while the node stays in (platform.isolation)
        "gpu_isolated": _isolated(v),
    }  # fmt: skip


def _isolated(v: NodeView) -> dict[str, Any] | None:
    from gpuvigil.platform.isolation import decode_isolation

    got = decode_isolation(v.isolation_text)
    if got is None:
        return None
    return {"index": got.index, "gpu_uuid": got.gpu_uuid, "step": got.step, "code": got.code,
            "since": got.since.isoformat(), "reason": got.reason, "scope": got.scope}  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command("nodes")
    def nodes(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        name: str = typer.Argument(None, help="Show one node with its full history."),
        cluster: str = typer.Option(None, "--cluster", help=CLUSTER_HELP),
        config: Path = CONFIG_OPTION,
        kubeconfig: Path = KUBECONFIG_OPTION,
        context: str = CONTEXT_OPTION,
        as_json: bool = typer.Option(False, "--json", help="One JSON object per node."),
    ) -> None:
        """List each node's gpuvigil state (HEALTHY, SUSPECT, DRAINING, REMEDIATING,
        VALIDATING, QUARANTINED), since when, why, who blocks it, what the controller
        does next and what holds it (budget, breaker, capacity, cooldown); one NODE adds
        its history.

        Under a dry-run controller the state, reason and history are what the
        live controller would have done, marked "(dry run)". The story of one node in time
        order: gpuvigil explain NODE."""
        from gpuvigil.core.findings import utcnow
        from gpuvigil.platform.clusters.base import ClusterError, NotFound

        cfg = load_controller_config(
            config, cluster_overrides(cluster, kubeconfig, context)
        ).controller
        k8s = cfg.kubernetes.model_copy(update={"count_pods": "all"})  # show everyone's work
        adapter = open_or_exit(cfg, k8s)
        try:
            views = [adapter.get_node(name)] if name else adapter.list_nodes()
        except NotFound as e:
            typer.echo(f"no node named {name!r} in the {cfg.cluster} cluster", err=True)
            raise typer.Exit(CliExit.FAILED) from e
        except ClusterError as e:
            typer.echo(f"cannot read the nodes: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        now = utcnow()
        views_sorted = sorted(views, key=lambda v: v.name)
        rows = [node_row(v) for v in views_sorted]
        if as_json:
            for row in rows:
                typer.echo(json.dumps(row))
            return
        ages = [_ago(_since(r), now) for r in rows]
        render(rows, ages, history=bool(name))


def render(rows: list[dict[str, object]], ages: list[str], *, history: bool) -> None:
    """Each node's row (and, for one node, its history), laid out to the terminal's width
    by `observe.terminal`: a node name, a reason or a blocker is never cut."""
    from gpuvigil.observe import terminal
    from gpuvigil.observe.terminal import Column, plain

    console = terminal.console()
    cols = (Column("node", key=True), Column("state"), Column("age", justify="right"),
            Column("health"), Column("blocked by"), Column("work", justify="right"),
            Column("reason"), Column("next"), Column("held by"))  # fmt: skip
    cells = [
        [plain(str(r["node"])),
         plain(str(r["state"]) + (" (dry run)" if r.get("dry_run") else "")
               + (" (spare)" if r.get("spare") else "")), age,
         plain(str(r["health"])),
         plain(", ".join(r["blocked_by"]) or "-"),  # type: ignore[arg-type]
         str(r["running"]), plain(str(r["reason"])), plain(str(r.get("next") or "-")),
         plain(f"{r.get('held_by')}: {r['held']}" if r.get("held") else "-")]
        for r, age in zip(rows, ages, strict=True)
    ]  # fmt: skip
    console.print(terminal.render(cols, cells, width=console.width))
    if history:
        for r in rows:
            hist = [[t["at"], plain(f"-> {t['to']}"), plain(str(t["reason"]))]
                    for t in r["history"]]  # type: ignore[attr-defined]  # fmt: skip
            cols = (Column("at (UTC)", key=True), Column("to", wrap=False), Column("reason"))
            console.print(terminal.render(cols, hist, width=console.width,
                                          title=f"history of {r['node']}"))  # fmt: skip
            console.print(terminal.render(
                (Column("began (UTC)", key=True), Column("codes"), Column("steps"),
                 Column("outcome")),
                [[e["start"], plain(",".join(e["codes"]) or "-"),
                  plain(",".join(e["steps"]) or "-"),
                  plain(e["outcome"] + (f" (released by {e['released_by']})"
                                        if e["released_by"] else ""))]
                 for e in r.get("episodes", [])],  # type: ignore[attr-defined]
                width=console.width, title=f"episodes of machine {r.get('machine') or '?'}",
            ))  # fmt: skip
