"""Terminal rendering of a report `Summary` with rich tables (`gpuvigil report`)."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from gpuvigil.observe.attribution import CAUSES
from gpuvigil.observe.summary import Summary

ATTRIBUTIONS_SHOWN = 20


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def pct(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def secs(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 120:
        return f"{x:.1f}s"
    if x < 7200:
        return f"{x / 60:.1f}m"
    return f"{x / 3600:.1f}h"


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


def slo_table(s: Summary) -> Table:
    j = s.slo.to_json()
    t = Table(title=f"SLOs {when(s.slo.start)} .. {when(s.slo.end)} UTC", title_justify="left")
    for col in ("SLO", "achieved", "target", "met", "budget burned", "detail"):
        t.add_column(col, justify="right" if col not in ("SLO", "detail") else "left")
    a, js = j["availability"], j["job_success"]

    def met(x: bool | None) -> str:
        return "-" if x is None else "[green]yes[/green]" if x else "[red]NO[/red]"

    t.add_row(
        "node availability", pct(a["achieved"]), pct(a["target"], 2), met(a["met"]),
        _burn(a["budget_burned"]),
        f"{a['in_service_seconds'] / 3600:.1f} of "
        f"{(a['node_seconds'] - a['maintenance_seconds']) / 3600:.1f} node-h in service; "
        f"{a['maintenance_seconds'] / 3600:.1f} node-h planned maintenance excluded",
    )  # fmt: skip
    t.add_row(
        "job success", pct(js["achieved"], 2), pct(js["target"], 2), met(js["met"]),
        _burn(js["budget_burned"]),
        f"{js['succeeded']} ok, {js['failed']} failed, {js['cancelled']} cancelled, "
        f"{js['restarts']} restarts",
    )  # fmt: skip
    g = j["goodput"]
    t.add_row(
        "goodput", pct(g["ratio"], 2), "-", "-", "-",
        f"{g['productive_gpu_s'] / 3600:.1f} productive of {g['allocated_gpu_s'] / 3600:.1f} GPU-h",
    )  # fmt: skip
    for name, d in (("MTTD", s.slo.mttd), ("MTTR", s.slo.mttr)):
        t.add_row(
            name, secs(d.mean), "-", "-", "-",
            f"n={d.count} p50={secs(d.quantile(0.5))} p90={secs(d.quantile(0.9))} "
            f"max={secs(d.high if d.count else None)}",
        )  # fmt: skip
    dr = j["drains"]
    fp = dr["false_positive"] / dr["total"] if dr["total"] else None
    t.add_row(
        "false-positive drains", pct(fp, 1), "-", "-", "-",
        f"{dr['false_positive']} of {dr['total']} drains returned without repair; "
        f"{dr['cordons']} cordons without drain; "
        f"{dr['absorbed_incidents']} incidents cleared in service; "
        f"{j['breaker_trips']} breaker trips",
    )  # fmt: skip
    return t


def cause_table(s: Summary) -> Table:
    t = Table(title="Failures and restarts by cause", title_justify="left", min_width=40)
    t.add_column("cause")
    t.add_column("count", justify="right")
    t.add_column("share", justify="right")
    total = s.attribution.total
    for c in CAUSES:
        n = s.attribution.by_cause.get(c, 0)
        t.add_row(c, str(n), pct(n / total if total else None, 1))
    return t


def attribution_table(s: Summary, *, limit: int = ATTRIBUTIONS_SHOWN) -> Table:
    shown = list(s.attribution.attributions)[-limit:]
    t = Table(
        title=f"Attribution (latest {len(shown)} of {s.attribution.total})", title_justify="left"
    )
    for col in ("time (UTC)", "job", "event", "cause", "conf", "most likely", "evidence"):
        t.add_column(col, justify="right" if col == "conf" else "left")
    for a in shown:
        ev = "; ".join(a.evidence[:3]) + (
            f" (+{len(a.evidence) - 3})" if len(a.evidence) > 3 else ""
        )
        t.add_row(when(a.ts), a.job, a.event, a.cause, f"{a.confidence:.2f}", a.summary, ev)
    return t


def offenders_table(s: Summary) -> Table:
    t = Table(title="Top offending nodes and GPUs", title_justify="left")
    for col in ("node", "downtime", "job failures", "GPU", "failed findings"):
        t.add_column(col, justify="left" if col in ("node", "GPU") else "right")
    nodes, gpus = s.top_nodes(), s.top_gpus()
    for i in range(max(len(nodes), len(gpus))):
        n = nodes[i] if i < len(nodes) else None
        g = gpus[i] if i < len(gpus) else None
        t.add_row(
            n["node"] if n else "", secs(n["downtime_s"]) if n else "",
            str(n["job_failures"]) if n else "",
            f"{g['gpu']} of {g['node']}" if g else "", str(g["findings"]) if g else "",
        )  # fmt: skip
    return t


def render(s: Summary, console: Console) -> None:
    for table in (slo_table(s), cause_table(s), attribution_table(s), offenders_table(s)):
        console.print(table)
    st = s.stats
    console.print(
        f"read {st.events} events from {len(st.sources)} file(s); "
        f"skipped {st.skipped_total} bad line(s)"
    )
