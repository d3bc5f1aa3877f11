"""`gpuvigil logscan FILE|-`: every Xid/SXid event in a kernel log, as a table or JSON.

For support tickets and post-mortems: paste any kernel log (dmesg in any time format,
journalctl, syslog's kern.log, a /dev/kmsg capture) and get its GPU and NVSwitch events,
one per log line, in order, each with the shipped catalog's verdict for that one line
(the family of the GPU is not known here, so the base entries apply; counts, clearing and
escalation are the rules' business: `gpuvigil analyze`). The JSON form is a stable
contract (docs/kernel-log.md). Reads in chunks, so a multi-GB log does not need a multi-GB memory.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer

from gpuvigil.node.catalog.xid import Rule, XidCatalog, load_catalog
from gpuvigil.node.probes.kernel_log_parser import iter_stream
from gpuvigil.node.readings import XidEvent


def event_json(ev: XidEvent, rule: Rule | None = None) -> dict[str, Any]:
    """One event as the JSON object `logscan --json` prints (stable: add keys, never
    rename or drop). With the catalog's rule, the event's own verdict is added."""
    out: dict[str, Any] = {
        "kind": ev.kind,
        "code": ev.code,
        "pci_bus_id": ev.pci_bus_id,
        "timestamp": ev.timestamp,
        "message": ev.message,
        "finding_code": ev.code_name,
        "bus_id": ev.bus_id,
        "time": ev.time.isoformat() if ev.time is not None else None,
        "uptime_s": ev.uptime_s,
        "pid": ev.pid,
        "process": ev.process,
        "device": ev.device,
        "seq": ev.seq,
        "line": ev.line,
    }
    if rule is not None:
        verdict = rule.outcome_for(ev.message)
        out |= {
            "mnemonic": rule.name,
            "in_catalog": rule.known,
            "status": verdict.status.value,
            "action": verdict.action.value,
            "fatal": verdict.fatal,
        }
    return out


def register(app: typer.Typer) -> None:
    @app.command("logscan")
    def logscan(
        path: str = typer.Argument(
            ...,
            metavar="FILE|-",
            help="A kernel log (dmesg, dmesg -T/--time-format iso, journalctl -k, syslog "
            "kern.log, a /dev/kmsg capture); '-' reads standard input.",
        ),
        as_json: bool = typer.Option(
            False, "--json", help="Print a JSON array of event objects instead of a table."
        ),
        year: int | None = typer.Option(
            None,
            "--year",
            help="Year of syslog-style stamps ('Nov 30 07:31:02'), which print none; fills "
            "the 'time' field. Without it that field is null for such lines.",
        ),
        tz: str = typer.Option(
            "UTC",
            "--tz",
            help="IANA time zone of stamps printed without an offset (dmesg -T, syslog); "
            "used for the 'time' field.",
        ),
    ) -> None:
        """Every NVIDIA Xid (GPU) and SXid (NVSwitch) event in a kernel log, in order.

        One event per log line: a line where the driver printed `Xid (PCI:<bus>): <code>`.

        Mentions such as "caused by previous Xid 149" are not events.

        Exit status: 0 when the log was read (with or without events), 2 when it could not.

        Examples:

          sudo dmesg --time-format iso | gpuvigil logscan -

          journalctl -k -b -1 | gpuvigil logscan - --json > xids.json

          gpuvigil logscan /var/log/kern.log --year 2026
        """
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as e:
            typer.echo(f"gpuvigil logscan: unknown time zone {tz!r}", err=True)
            raise typer.Exit(2) from e
        try:
            stream, close = _open(path)
        except OSError as e:
            typer.echo(f"gpuvigil logscan: cannot read {path}: {e.strerror or e}", err=True)
            raise typer.Exit(2) from e
        try:
            events = iter_stream(stream, year=year, tz=zone)
            catalog = load_catalog()
            if as_json:
                _print_json(events, catalog)
            else:
                _print_table(events, catalog, source=path)
        except BrokenPipeError:  # `gpuvigil logscan big.log | head`: the reader has enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return
        except OSError as e:
            typer.echo(f"gpuvigil logscan: error reading {path}: {e.strerror or e}", err=True)
            raise typer.Exit(2) from e
        finally:
            close()


def _open(path: str) -> tuple[BinaryIO, Any]:
    if path == "-":
        return sys.stdin.buffer, lambda: None
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(21, "is a directory")
    f = p.open("rb")
    return f, f.close


def _print_json(events: Iterator[XidEvent], catalog: XidCatalog) -> None:
    out = sys.stdout
    out.write("[")
    sep = "\n  "
    for ev in events:
        out.write(sep)
        out.write(json.dumps(event_json(ev, catalog.rule(ev.kind, ev.code)), ensure_ascii=False))
        sep = ",\n  "
    out.write("\n]\n" if sep != "\n  " else "]\n")
    out.flush()


TABLE_MAX_ROWS = 1000  # rich lays a table out row by row (~3 ms each); more go plain


def _row(n: int, ev: XidEvent, catalog: XidCatalog) -> tuple[str, ...]:
    proc = ev.process or ev.device or ""
    if ev.pid is not None:
        proc = f"{proc} ({ev.pid})"
    rule = catalog.rule(ev.kind, ev.code)
    verdict = rule.outcome_for(ev.message)
    text = f"{verdict.status.value} {verdict.action.value}{' fatal' if verdict.fatal else ''}"
    if not rule.known:
        text += " (not in catalog)"
    return (
        str(n),
        ev.kind,
        str(ev.code),
        ev.pci_bus_id,
        ev.timestamp or "",
        proc,
        text,
        ev.message,
    )


_COLUMNS = ("#", "kind", "code", "PCI bus id", "timestamp", "process", "verdict", "message")


def _print_table(events: Iterator[XidEvent], catalog: XidCatalog, *, source: str) -> None:
    """A rich table for up to TABLE_MAX_ROWS events; beyond that, plain aligned columns
    streamed as they are found (a 20,000-event log prints in a second, not minutes)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # `| head`: the reader had enough, not an error
            self.quiet = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(0)

    console = _Console(soft_wrap=False, emoji=False)  # ":ab:" in a bus id is not an emoji
    counts: Counter[str] = Counter()
    rows: list[tuple[str, ...]] = []
    plain = False
    for n, ev in enumerate(events, 1):
        counts[f"{'SXid' if ev.kind == 'sxid' else 'Xid'} {ev.code}"] += 1
        rows.append(_row(n, ev, catalog))
        if len(rows) > TABLE_MAX_ROWS:
            if not plain:
                plain = True
                _plain_line(_COLUMNS)
            for r in rows:
                _plain_line(r)
            rows.clear()
    if plain:
        for r in rows:
            _plain_line(r)
        sys.stdout.flush()
    elif not counts:
        console.print("no Xid or SXid events found", markup=False)
        return
    else:
        from gpuvigil.observe import terminal
        from gpuvigil.observe.terminal import Column, plain

        where = "standard input" if source == "-" else source
        columns = [Column(c, key=c == "#", justify="right" if c in ("#", "code") else "left")
                   for c in _COLUMNS]  # fmt: skip
        cells = [[plain(c) for c in r] for r in rows]
        title = f"Xid/SXid events in {where}"
        console.print(terminal.render(columns, cells, width=console.width, title=title))
    summary = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
    console.print(f"{sum(counts.values())} event(s): {summary}", markup=False)


_WIDTHS = (6, 4, 5, 12, 32, 24, 26)


def _plain_line(row: tuple[str, ...]) -> None:
    cells = [c.ljust(w) for c, w in zip(row, _WIDTHS, strict=False)]
    sys.stdout.write("  ".join([*cells, row[-1]]) + "\n")
