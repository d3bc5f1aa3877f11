"""Terminal rendering of a report `Summary` (`gpuvigil report`), at any width.

The figures come from `Summary.figures()` and are written by `observe.figures.show`, as
in the JSON and the HTML report; the layout is `observe.terminal`'s (no cut tokens).
"""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console

from gpuvigil.core.exit_codes import FAILURES
from gpuvigil.observe import terminal
from gpuvigil.observe.figures import duration, percent
from gpuvigil.observe.summary import TOP, Summary
from gpuvigil.observe.terminal import Column, plain

ATTRIBUTIONS_SHOWN = 20
SEE_ALL = "--all lists every one kept (up to 1,000), as does --json"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def pct(x: float | None, digits: int = 3) -> str:
    return percent(x, digits)


def burn_text(x: float | None) -> str:
    """Budget burned: a percentage up to 10x the budget, then a multiple."""
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if x < 10 else f"{x:,.0f}x budget"


def _burn(x: float | None) -> str:
    if x is None:
        return "-"
    style = "green" if x < 0.5 else "yellow" if x < 1.0 else "red"
    return f"[{style}]{burn_text(x)}[/{style}]"


def _met(x: bool | None) -> str:
    return "-" if x is None else "[green]yes[/green]" if x else "[red]NO[/red]"


SLO_COLUMNS = (
    Column("SLO", key=True),
    Column("achieved", justify="right", wrap=False),
    Column("target", justify="right", wrap=False),
    Column("met", justify="right"),
    Column("budget burned", justify="right", wrap=False),
    Column("detail"),
)


def slo_rows(s: Summary) -> list[list[terminal.Cell]]:
    j = s.slo.to_json()
    f = {x.key: x for x in s.figures()}
    a, js, g, dr = j["availability"], j["job_success"], j["goodput"], j["drains"]
    fp = dr["false_positive"] / dr["total"] if dr["total"] else None
    rows: list[list[terminal.Cell]] = [
        [f["node_availability"].label, f["node_availability"].text, pct(a["target"], 2),
         _met(a["met"]), _burn(a["budget_burned"]),
         plain(f"{a['in_service_seconds'] / 3600:,.1f} of "
               f"{(a['node_seconds'] - a['maintenance_seconds']) / 3600:,.1f} node-h in "
               f"service; {a['maintenance_seconds'] / 3600:,.1f} node-h planned maintenance "
               "excluded")],
        [f["job_success_rate"].label, f["job_success_rate"].text, pct(js["target"], 2),
         _met(js["met"]), _burn(js["budget_burned"]),
         plain(f"{js['succeeded']} ok, {js['failed']} failed, {js['cancelled']} cancelled, "
               f"{js['censored']} still running (no verdict); by work "
               f"{f['job_success_by_work'].text}; {js['restarts']} restarts")],
        [f["goodput"].label, f["goodput"].text, "-", "-", "-",
         plain(f"{g['productive_gpu_s'] / 3600:,.1f} productive of "
               f"{g['allocated_gpu_s'] / 3600:,.1f} GPU-h")],
        [f["ettr"].label, f["ettr"].text, "-", "-", "-",
         plain(f"{j['ettr']['productive_gpu_s'] / 3600:,.1f} productive of "
               f"{j['ettr']['wall_gpu_s'] / 3600:,.1f} GPU-h of wall time since each job "
               "started")],
    ]  # fmt: skip
    for key, d in (("mttd_s", s.slo.mttd), ("mttr_s", s.slo.mttr)):
        rows.append([
            f[key].label, f[key].text, "-", "-", "-",
            plain(f"n={d.count} p50={duration(d.quantile(0.5))} "
                  f"p90={duration(d.quantile(0.9))} max={duration(d.high if d.count else None)}"),
        ])  # fmt: skip
    rows.append([
        f["false_positive_drains"].label, pct(fp, 1), "-", "-", "-",
        plain(f"{dr['false_positive']} of {dr['total']} drains returned without repair; "
              f"{dr['human_releases']} ended by a person's release (never false positives); "
              f"{dr['cordons']} cordons without drain; {dr['absorbed_incidents']} incidents "
              f"cleared in service; {j['breaker_trips']} breaker trips"),
    ])  # fmt: skip
    return rows


def cause_rows(s: Summary) -> list[list[terminal.Cell]]:
    total = s.attribution.total
    return [
        [c.value, f"{s.attribution.by_cause.get(c, 0):,}",
         pct(s.attribution.by_cause.get(c, 0) / total if total else None, 1)]
        for c in FAILURES
    ]  # fmt: skip


def cause_title(s: Summary) -> str:
    """The cause table's title; it says how many events carried no cause (old logs), which
    are counted as unknown rather than guessed from their words."""
    n = s.attribution.without_cause
    return "Failures and restarts by cause" + (
        f" ({n:,} recorded no cause: counted as unknown)" if n else ""
    )


def attribution_rows(s: Summary, *, limit: int) -> list[list[terminal.Cell]]:
    shown = list(s.attribution.attributions)[-limit:] if limit else s.attribution.attributions
    rows: list[list[terminal.Cell]] = []
    for a in shown:
        ev = "; ".join(a.evidence[:3]) + (
            f" (+{len(a.evidence) - 3} more)" if len(a.evidence) > 3 else ""
        )
        rows.append([when(a.ts), plain(a.job), a.event, a.cause, f"{a.confidence:.2f}",
                     plain(a.summary), plain(ev)])  # fmt: skip
    return rows


def render(s: Summary, console: Console, *, limit: int = ATTRIBUTIONS_SHOWN) -> None:
    """Every table of the report, laid out to the console's width."""
    w = console.width
    title = f"SLOs {when(s.slo.start)} .. {when(s.slo.end)} UTC"
    console.print(terminal.render(SLO_COLUMNS, slo_rows(s), width=w, title=title))
    cause_cols = (Column("cause", key=True), Column("count", justify="right"),
                  Column("share", justify="right"))  # fmt: skip
    console.print(terminal.render(cause_cols, cause_rows(s), width=w,
                                  title=cause_title(s)))  # fmt: skip
    attr_cols = (Column("time (UTC)", key=True), Column("job", key=True), Column("event"),
                 Column("cause"), Column("conf", justify="right"), Column("most likely"),
                 Column("evidence"))  # fmt: skip
    rows = attribution_rows(s, limit=limit)
    terminal.print_table(console, attr_cols, rows, title=f"Attribution (latest {len(rows)})",
                         total=s.attribution.total, noun="attributions",
                         see_all=SEE_ALL)  # fmt: skip
    nodes = s.top_nodes()
    node_cols = (Column("node", key=True), Column("downtime", justify="right", wrap=False),
                 Column("job failures", justify="right"))  # fmt: skip
    node_rows = [[plain(n["node"]), duration(n["downtime_s"]), str(n["job_failures"])]
                 for n in nodes]  # fmt: skip
    terminal.print_table(console, node_cols, node_rows,
                         title=f"Top {TOP} offending nodes, by downtime",
                         total=s.node_count(), noun="nodes with downtime or failures",
                         see_all="--json lists the top ones with their figures")  # fmt: skip
    gpus = s.top_gpus()
    gpu_cols = (Column("node", key=True), Column("GPU", key=True),
                Column("failed findings", justify="right"))  # fmt: skip
    gpu_rows = [[plain(g["node"]), plain(g["gpu"]), str(g["findings"])] for g in gpus]
    terminal.print_table(console, gpu_cols, gpu_rows,
                         title=f"Top {TOP} offending GPUs, by failed findings",
                         total=len(s.findings_by_gpu), noun="GPUs with failed findings",
                         see_all="--json lists the top ones")  # fmt: skip
    st = s.stats
    console.print(
        f"read {st.events} events from {len(st.sources)} file(s); "
        f"skipped {st.skipped_total} bad line(s)"
    )
