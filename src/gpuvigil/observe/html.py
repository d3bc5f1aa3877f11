"""The HTML report (`gpuvigil report EVENTS --html out.html`, `gpuvigil demo`): ONE file.

Called by `commands/report.py` and the simulator's demo. Inline CSS and inline SVG charts
from `observe.svg`; no scripts, no fonts, no external URL of any kind, so it opens offline,
mails as one attachment and passes strict content-security policies.

Every number comes from a `Figure` (`observe.figures`) and is written by its `show()`, so
the page shows what the terminal table and `--json` show. The simulator's demo adds its
runs' ground truth above layer 4's report of the full run's events, and each part says
which measure it is. Text is never cut: cells wrap at spaces only (a token with a hyphen
or a slash, such as a node name, stays on one line), and chart labels get the room they
need.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape

from gpuvigil.core.exit_codes import FAILURES
from gpuvigil.observe import svg
from gpuvigil.observe.figures import LOGGED, MEASURES, TABLES, TRUTH, Figure, duration
from gpuvigil.observe.stats import Distribution
from gpuvigil.observe.summary import Summary
from gpuvigil.observe.tables import burn_text, cause_title, pct, when

ATTRIBUTIONS_SHOWN = 50

CSS = """
body{font-family:system-ui,sans-serif;color:#1f2937;margin:24px auto;max-width:1360px;
 padding:0 16px;background:#f9fafb}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 8px}
h1.part{font-size:18px;margin:24px 0 4px}
.sub{color:#6b7280;margin-bottom:16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:12px;
 margin-bottom:16px}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:12px}
.card .v{font-size:24px;font-weight:600} .card .t{color:#6b7280;font-size:12px}
.ok{color:#16a34a} .bad{color:#dc2626}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:12px}
.panel{background:#fff;border:1px solid #e5e7eb;border-radius:8px;padding:12px;
 margin-bottom:12px;overflow-x:auto}
.note{color:#4b5563;font-size:13px;margin:0 0 8px}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #f3f4f6;vertical-align:top}
th{background:#f3f4f6} td.n,th.n{text-align:right}
.k{white-space:nowrap}
svg{max-width:100%;height:auto}
"""
# Where a browser would break a line inside a token (after a hyphen or a slash).
BREAKS_INSIDE = re.compile(r"[-/]")


def text(s: str) -> str:
    """Escaped text that wraps at spaces only: tokens a browser would split (node-00017,
    a/b) are kept whole."""
    return " ".join(
        f'<span class="k">{escape(w)}</span>' if BREAKS_INSIDE.search(w) else escape(w)
        for w in s.split(" ")
    )


def _card(title: str, value: str, detail: str, *, met: bool | None = None) -> str:
    cls = "" if met is None else ("ok" if met else "bad")
    return (
        f'<div class="card"><div class="t">{text(title)}</div>'
        f'<div class="v {cls}">{text(value)}</div><div class="t">{text(detail)}</div></div>'
    )


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], *,
           numeric: set[int] | None = None) -> str:  # fmt: skip
    numeric = numeric or set()

    def cell(tag: str, i: int, c: str) -> str:
        cls = ' class="n"' if i in numeric else ""
        return f"<{tag}{cls}>{text(c)}</{tag}>"

    th = "".join(cell("th", i, h) for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(r)) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _panel(title: str, content: str, *, note: str = "") -> str:
    n = f'<p class="note">{text(note)}</p>' if note else ""
    return f'<section class="panel"><h2>{text(title)}</h2>{n}{content}</section>'


RUNS_PER_TABLE = 5  # run columns side by side before the figures' table is split in parts


def runs_section(runs: Mapping[str, Sequence[Figure]], *, main: str) -> str:
    """The simulator's runs: the terminal's tables (the comparison, then what each run
    did), then every figure of every run (one row per figure, so a new figure appears here
    without code; a part per `RUNS_PER_TABLE` runs, so ten runs still fit 1280 px)."""
    names = list(runs)
    first = list(runs[names[0]])
    compare = ""
    for which, title in TABLES.items():
        tabled = [f for f in first if f.spec.table == which]
        compare += (f"<h2>{text(title)}</h2>" if title else "") + _table(
            ["run", *[f.label for f in tabled]],
            [[n, *[f.text for f in runs[n] if f.spec.table == which]] for n in names],
            numeric=set(range(1, len(tabled) + 1)),
        )
    by_key = {n: {f.key: f for f in runs[n]} for n in names}
    every = ""
    for i in range(0, len(names), RUNS_PER_TABLE):
        part = names[i : i + RUNS_PER_TABLE]
        every += _table(
            ["figure", *part, "what it counts"],
            [[f.label, *[by_key[n][f.key].text if f.key in by_key[n] else "-" for n in part],
              f.spec.about] for f in first],
            numeric=set(range(1, len(part) + 1)),
        )  # fmt: skip
    return (
        '<h1 class="part">The simulated fleet: ground truth of every run</h1>'
        f'<div class="sub">{text(MEASURES[TRUTH].capitalize())}: the same figures as the '
        "terminal table and <code>--json</code>.</div>"
        + _panel("Runs compared", compare)
        + _panel("Every figure of every run", every)
        + f'<h1 class="part">Layer 4: the {text(main)} run as its event log shows it</h1>'
        f'<div class="sub">{text(MEASURES[LOGGED].capitalize())}. Where a figure has the '
        "same name as above it can differ: MTTD counts only faults a check reported, MTTR "
        "starts at the first finding, not at the fault's onset.</div>"
    )


def cards(s: Summary) -> list[str]:
    """Layer 4's headline figures (`Summary.figures`), as cards."""
    j = s.slo.to_json()
    a, js, dr = j["availability"], j["job_success"], j["drains"]
    f = {x.key: x for x in s.figures()}
    g = j["goodput"]

    def dist(d: Distribution) -> str:
        return f"p90 {duration(d.quantile(0.9))}, n={d.count}"

    return [
        _card(f["node_availability"].label, f["node_availability"].text,
              f"target {pct(a['target'], 2)}, budget burned {burn_text(a['budget_burned'])}",
              met=a["met"]),
        _card(f["job_success_rate"].label, f["job_success_rate"].text,
              f"target {pct(js['target'], 2)}, budget burned {burn_text(js['budget_burned'])}",
              met=js["met"]),
        _card(f["goodput"].label, f["goodput"].text,
              f"{g['productive_gpu_s'] / 3600:,.0f} of {g['allocated_gpu_s'] / 3600:,.0f} GPU-h"),
        _card(f"{f['mttd_s'].label} (mean)", f["mttd_s"].text, dist(s.slo.mttd)),
        _card(f"{f['mttr_s'].label} (mean)", f["mttr_s"].text, dist(s.slo.mttr)),
        _card(f["false_positive_drains"].label, f"{dr['false_positive']} / {dr['total']}",
              f"{f['breaker_trips'].text} breaker trips, {f['job_interruptions'].text} job "
              "restarts"),
    ]  # fmt: skip


def render_html(
    s: Summary,
    *,
    runs: Mapping[str, Sequence[Figure]] | None = None,
    main: str = "full",
    panels: Sequence[tuple[str, Sequence[str], Sequence[Sequence[str]], str]] = (),
) -> str:
    """The report of `s`; with `runs` (the simulator's), their figures first. `panels`:
    more tables (title, header, rows, note) after the attribution, e.g. the simulator's
    ground truth beside layer 4's attribution."""
    points = s.slo.timeline.series() if s.slo.timeline is not None else []
    series = [(p["t"], p["availability"]) for p in points if p["availability"] is not None]
    causes = [(c.value, float(s.attribution.by_cause.get(c, 0))) for c in FAILURES]
    nodes = s.top_nodes()
    gpus = s.top_gpus()
    charts = [
        _panel("Availability over time", svg.line_chart(
            series, label="availability over time", target=s.slo.targets.availability)),
        _panel(cause_title(s), svg.bar_chart(causes, label="failures by cause")),
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
    node_rows = [[n["node"], duration(n["downtime_s"]), str(n["job_failures"])] for n in nodes]
    code_rows = [[c, str(n)] for c, n in s.findings_by_code.most_common(15)]
    figure_rows = [[f.label, f.text, f.spec.about] for f in s.figures()]
    st = s.stats
    title = f"gpuvigil report: {when(s.slo.start)} to {when(s.slo.end)} UTC"
    head = [
        "time (UTC)", "job", "event", "cause", "confidence", "most likely cause", "evidence",
    ]  # fmt: skip
    left_out = s.attribution.total - len(shown)
    attribution = _panel(
        f"Attribution (latest {len(shown)} of {s.attribution.total})",
        _table(head, attr_rows, numeric={4}),
        note=f"{left_out} older ones left out: gpuvigil report --json lists up to 1,000."
        if left_out
        else "",
    )
    every = _table(["figure", "value", "what it counts"], figure_rows, numeric={1})
    parts = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{text(title)}</h1>",
        f'<div class="sub">{st.events} events read from {len(st.sources)} file(s), '
        f"{st.skipped_total} bad line(s) skipped.</div>",
        runs_section(runs, main=main) if runs else "",
        f'<div class="cards">{"".join(cards(s))}</div>',
        f'<div class="grid">{"".join(charts)}</div>',
        attribution,
        *(_panel(t, _table(h, r), note=n) for t, h, r, n in panels),
        '<div class="grid">',
        _panel("Nodes", _table(["node", "downtime", "job failures"], node_rows, numeric={1, 2})),
        _panel("Failed findings by code", _table(["code", "count"], code_rows, numeric={1})),
        "</div>",
        _panel("Every figure of the report", every, note=MEASURES[LOGGED].capitalize() + "."),
        "</body></html>\n",
    ]
    return "".join(parts)
