"""The HTML report (`gpuvigil report EVENTS --html out.html`): ONE self-contained file.

Called by `commands/report.py`. Inline CSS and inline SVG charts from `observe.svg`; no
scripts, no fonts, no external URL of any kind, so it opens offline, mails as one
attachment and passes strict content-security policies.
"""

from __future__ import annotations

from html import escape

from gpuvigil.observe import svg
from gpuvigil.observe.attribution import CAUSES
from gpuvigil.observe.summary import Summary
from gpuvigil.observe.tables import burn_text, pct, secs, when

ATTRIBUTIONS_SHOWN = 50

CSS = """
body{font-family:system-ui,sans-serif;color:#1f2937;margin:24px auto;max-width:1360px;
 padding:0 16px;background:#f9fafb}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 8px}
.sub{color:#6b7280;margin-bottom:16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:12px;
 margin-bottom:16px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:12px}
.card .v{font-size:24px;font-weight:600} .card .t{color:#6b7280;font-size:12px}
.ok{color:#16a34a} .bad{color:#dc2626}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(660px,1fr));gap:12px}
.panel{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:12px;
 margin-bottom:12px;overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #f3f4f6;vertical-align:top}
th{background:#f3f4f6} td.n{text-align:right}
td:nth-child(-n+3){white-space:nowrap}
"""


def _card(title: str, value: str, detail: str, *, met: bool | None = None) -> str:
    cls = "" if met is None else ("ok" if met else "bad")
    return (
        f'<div class="card"><div class="t">{escape(title)}</div>'
        f'<div class="v {cls}">{escape(value)}</div><div class="t">{escape(detail)}</div></div>'
    )


def _table(head: list[str], rows: list[list[str]], *, numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{escape(c)}</td>' if i in numeric else f"<td>{escape(c)}</td>"
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _panel(title: str, content: str) -> str:
    return f'<section class="panel"><h2>{escape(title)}</h2>{content}</section>'


def render_html(s: Summary) -> str:
    j = s.slo.to_json()
    a, js, g, dr = j["availability"], j["job_success"], j["goodput"], j["drains"]
    cards = [
        _card("node availability", pct(a["achieved"]),
              f"target {pct(a['target'], 2)}, budget burned {burn_text(a['budget_burned'])}",
              met=a["met"]),
        _card("job success", pct(js["achieved"], 2),
              f"target {pct(js['target'], 2)}, budget burned {burn_text(js['budget_burned'])}",
              met=js["met"]),
        _card("goodput", pct(g["ratio"], 2),
              f"{g['productive_gpu_s'] / 3600:.0f} of {g['allocated_gpu_s'] / 3600:.0f} GPU-h"),
        _card("MTTD (mean)", secs(s.slo.mttd.mean), f"p90 {secs(s.slo.mttd.quantile(0.9))}, "
              f"n={s.slo.mttd.count}"),
        _card("MTTR (mean)", secs(s.slo.mttr.mean), f"p90 {secs(s.slo.mttr.quantile(0.9))}, "
              f"n={s.slo.mttr.count}"),
        _card("false-positive drains", f"{dr['false_positive']} / {dr['total']}",
              f"{j['breaker_trips']} breaker trips, {js['restarts']} job restarts"),
    ]  # fmt: skip
    points = s.slo.timeline.series() if s.slo.timeline is not None else []
    series = [(p["t"], p["availability"]) for p in points if p["availability"] is not None]
    causes = [(c, float(s.attribution.by_cause.get(c, 0))) for c in CAUSES]
    nodes = s.top_nodes()
    gpus = s.top_gpus()
    charts = [
        _panel("Availability over time", svg.line_chart(
            series, label="availability over time", target=s.slo.targets.availability)),
        _panel("Failures and restarts by cause", svg.bar_chart(causes, label="failures by cause")),
        _panel("Time to detect (MTTD)", svg.histogram(s.slo.mttd.samples, label="MTTD")),
        _panel("Time to repair (MTTR)", svg.histogram(s.slo.mttr.samples, label="MTTR")),
        _panel("Top offending nodes (downtime, hours)", svg.bar_chart(
            [(n["node"], round(n["downtime_s"] / 3600, 1)) for n in nodes], label="nodes",
            unit="h")),
        _panel("Top offending GPUs (failed findings)", svg.bar_chart(
            [(f"{r['gpu']} of {r['node']}", float(r["findings"])) for r in gpus], label="GPUs")),
    ]  # fmt: skip
    shown = list(s.attribution.attributions)[-ATTRIBUTIONS_SHOWN:][::-1]
    attr_rows = [
        [when(x.ts), x.job, x.event, x.cause, f"{x.confidence:.2f}", x.summary,
         "; ".join(x.evidence[:4])]
        for x in shown
    ]  # fmt: skip
    node_rows = [[n["node"], secs(n["downtime_s"]), str(n["job_failures"])] for n in nodes]
    code_rows = [[c, str(n)] for c, n in s.findings_by_code.most_common(15)]
    st = s.stats
    title = f"gpuvigil report: {when(s.slo.start)} to {when(s.slo.end)} UTC"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1>"
        f'<div class="sub">{st.events} events read from {len(st.sources)} file(s), '
        f"{st.skipped_total} bad line(s) skipped.</div>"
        f'<div class="cards">{"".join(cards)}</div>'
        f'<div class="grid">{"".join(charts)}</div>'
        + _panel(
            f"Attribution (latest {len(shown)} of {s.attribution.total})",
            _table(
                [
                    "time (UTC)",
                    "job",
                    "event",
                    "cause",
                    "confidence",
                    "most likely cause",
                    "evidence",
                ],
                attr_rows,
                numeric={4},
            ),
        )
        + '<div class="grid">'
        + _panel("Nodes", _table(["node", "downtime", "job failures"], node_rows, numeric={1, 2}))
        + _panel("Failed findings by code", _table(["code", "count"], code_rows, numeric={1}))
        + "</div></body></html>\n"
    )
