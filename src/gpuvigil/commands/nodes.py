"""`gpuvigil nodes`: each node's remediation state, why, and its recent history."""

from __future__ import annotations

import json
from datetime import datetime
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


def _ago(t: datetime | None, now: datetime) -> str:
    if t is None:
        return "-"
    s = int((now - t).total_seconds())
    return f"{s // 86400}d" if s >= 86400 else f"{s // 3600}h" if s >= 3600 else f"{s // 60}m"


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
        VALIDATING, QUARANTINED), since when, why, who blocks it, and its history."""
        from gpuvigil.core.findings import utcnow
        from gpuvigil.platform.clusters.base import ClusterError, NotFound
        from gpuvigil.platform.state import State

        cfg = load_controller_config(
            config, cluster_overrides(cluster, kubeconfig, context)
        ).controller
        k8s = cfg.kubernetes.model_copy(update={"count_pods": "all"})  # show everyone's work
        adapter = open_or_exit(cfg, k8s)
        try:
            views = [adapter.get_node(name)] if name else adapter.list_nodes()
        except NotFound as e:
            typer.echo(f"no node named {name!r} in the {cfg.cluster} cluster", err=True)
            raise typer.Exit(1) from e
        except ClusterError as e:
            typer.echo(f"cannot read the nodes: {e}", err=True)
            raise typer.Exit(2) from e
        now = utcnow()
        rows = []
        views_sorted = sorted(views, key=lambda v: v.name)
        for v in views_sorted:
            rec = v.record
            blocked = (["gpuvigil"] if v.blocked_by_us else []) + list(v.blocked_by_others)
            rows.append({
                "node": v.name,
                "state": rec.state.value if rec else State.HEALTHY.value,
                "since": rec.since.isoformat() if rec and rec.since else None,
                "reason": rec.reason if rec else "",
                "step": rec.step.value if rec and rec.step else None,
                "failures": rec.failures if rec else 0,
                "blocked_by": blocked,
                "running": v.running,
                "health": v.health.status.value if v.health else (v.health_error or "absent"),
                "history": [
                    {"at": t.at.isoformat(), "to": t.to.value, "reason": t.reason}
                    for t in (rec.history if rec else ())
                ],
            })  # fmt: skip
        if as_json:
            for row in rows:
                typer.echo(json.dumps(row))
            return
        ages = [_ago(v.record.since if v.record else None, now) for v in views_sorted]
        render(rows, ages, history=bool(name))


def render(rows: list[dict[str, object]], ages: list[str], *, history: bool) -> None:
    """Each node's row (and, for one node, its history), laid out to the terminal's width
    by `observe.terminal`: a node name, a reason or a blocker is never cut."""
    from gpuvigil.observe import terminal
    from gpuvigil.observe.terminal import Column, plain

    console = terminal.console()
    cols = (Column("node", key=True), Column("state"), Column("age", justify="right"),
            Column("health"), Column("blocked by"), Column("work", justify="right"),
            Column("reason"))  # fmt: skip
    cells = [
        [plain(str(r["node"])), plain(str(r["state"])), age, plain(str(r["health"])),
         plain(", ".join(r["blocked_by"]) or "-"),  # type: ignore[arg-type]
         str(r["running"]), plain(str(r["reason"]))]
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
