"""`gpuvigil report EVENTS...`: SLOs and failure attribution from recorded events.

Thin: parses options, streams the files through `observe.summary.summarize`, prints rich
tables (`observe.tables`), the stable JSON (`--json`) or writes the HTML report
(`observe.html`).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpuvigil.core import slo_targets
from gpuvigil.core.cli_exit import CliExit

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float | None:
    """'30d', '12h', '90m', '3600s', '3600' -> seconds; 'all' -> None (whole log)."""
    if text.strip().lower() == "all":
        return None
    m = DURATION.match(text.lower())
    if not m or float(m.group(1)) <= 0:
        raise typer.BadParameter(f"not a duration: {text!r} (examples: 30d, 12h, 90m, all)")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_time(text: str) -> float:
    """Epoch seconds or an ISO 8601 time (UTC when no offset is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise typer.BadParameter(f"not a time: {text!r} (epoch seconds or ISO 8601)") from e
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report(
        *,
        events: Annotated[
            list[str],
            typer.Argument(help="Event log files (JSONL, see docs/events.md), or - for stdin."),
        ],
        window: Annotated[
            str, typer.Option(help="SLO window ending at --end: 30d, 12h, 90m, 3600s, or 'all'.")
        ] = "30d",
        end: Annotated[
            str | None,
            typer.Option(help="End of the window (epoch s or ISO 8601). Default: the last event."),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the stable JSON report.")
        ] = False,
        html: Annotated[
            Path | None, typer.Option(help="Also write a self-contained HTML report here.")
        ] = None,
        availability_target: Annotated[
            float,
            typer.Option(
                min=0.0,
                max=1.0,
                help="Node availability SLO target (0.9995 = 99.95%).",
            ),
        ] = slo_targets.AVAILABILITY,
        job_success_target: Annotated[
            float, typer.Option(min=0.0, max=1.0, help="Job success SLO target (0.995 = 99.5%).")
        ] = slo_targets.JOB_SUCCESS,
        in_service_state: Annotated[
            list[str] | None,
            typer.Option(
                help="Controller state that counts as in service (repeatable; default HEALTHY)."
            ),
        ] = None,
        maintenance_state: Annotated[
            list[str] | None,
            typer.Option(
                help="A state your own tooling writes that counts as planned maintenance "
                "(repeatable; default none: `node.maintenance` events mark maintenance)."
            ),
        ] = None,
        lookback: Annotated[
            str, typer.Option(help="Attribution: evidence window before a failure.")
        ] = "10m",
        grace: Annotated[
            str, typer.Option(help="Attribution: evidence window after a failure.")
        ] = "2m",
        show_all: Annotated[
            bool, typer.Option("--all", help="List every attribution kept (up to 1,000).")
        ] = False,
        fail_on_breach: Annotated[
            bool,
            typer.Option(help="Exit 1 when availability or job success misses its target."),
        ] = False,
    ) -> None:
        """SLOs (availability, job success, goodput, MTTD, MTTR, false-positive drains,
        error-budget burn) and the likely cause of every failed or restarted job, from
        gpuvigil event logs. Streams: memory stays bounded however long the log.

        Example: gpuvigil report /var/log/gpuvigil/events.jsonl --window 30d --html out.html

        Exit status: 0 report written, 1 an SLO missed (only with --fail-on-breach), 2 no
        usable events or bad options.
        """
        from gpuvigil.observe import events as reader
        from gpuvigil.observe import terminal
        from gpuvigil.observe.slo import SloConfig, Targets
        from gpuvigil.observe.summary import summarize

        err = Console(stderr=True)
        window_s = parse_duration(window)
        lookback_s, grace_s = parse_duration(lookback), parse_duration(grace)
        end_ts = parse_time(end) if end else None
        if end_ts is None and window_s is not None:
            files = [p for p in events if p != reader.STDIN]
            if len(files) < len(events):
                err.print("report: reading stdin: give --end, or --window all")
                raise typer.Exit(CliExit.CANNOT_TELL)
            ends = [t for t in (reader.last_timestamp(p) for p in files) if t is not None]
            end_ts = max(ends) if ends else None
        start_ts = end_ts - window_s if (end_ts is not None and window_s is not None) else None

        stats = reader.ReadStats()

        def warn(msg: str) -> None:
            err.print(f"[yellow]warning:[/yellow] {msg}", highlight=False)

        with terminal.progress(quiet=as_json) as progress:
            progress(f"reading {len(events)} event log(s)", None)
            summary = summarize(
                reader.read_events(events, stats=stats, warn=warn),
                start=start_ts,
                end=end_ts,
                targets=Targets(availability=availability_target, job_success=job_success_target),
                config=SloConfig(
                    in_service_states=frozenset(in_service_state or SloConfig.in_service_states),
                    maintenance_states=frozenset(maintenance_state or ()),
                ),
                stats=stats,
                lookback_s=lookback_s or 0.0,
                grace_s=grace_s or 0.0,
            )
        if stats.events == 0:
            err.print("report: no usable events in the input")
            raise typer.Exit(CliExit.CANNOT_TELL)
        if html is not None:
            from gpuvigil.observe.html import render_html

            html.write_text(render_html(summary), encoding="utf-8")
            err.print(f"wrote {html}")
        if as_json:
            sys.stdout.write(json.dumps(summary.to_json(), indent=2, sort_keys=True) + "\n")
        else:
            from gpuvigil.observe.tables import ATTRIBUTIONS_SHOWN, render

            render(summary, terminal.console(), limit=0 if show_all else ATTRIBUTIONS_SHOWN)
        if fail_on_breach:
            slo = summary.slo.to_json()
            missed = [k for k in ("availability", "job_success") if slo[k]["met"] is False]
            if missed:
                err.print(f"report: SLO missed: {', '.join(missed)}")
                raise typer.Exit(CliExit.FAILED)
