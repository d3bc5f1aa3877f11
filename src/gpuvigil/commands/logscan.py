"""`gpuvigil logscan FILE|-`: every Xid/SXid event in a kernel log, as a table or JSON.

For support tickets and post-mortems: paste any kernel log (dmesg in any time format,
journalctl, syslog's kern.log, a /dev/kmsg capture) and get its GPU and NVSwitch events,
one per log line, in order. The JSON form is a stable contract (docs/kernel-log.md).
Reads in chunks, so a multi-GB log does not need a multi-GB memory.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import typer

from gpuvigil.node.probes.kernel_log_parser import iter_stream
from gpuvigil.node.readings import XidEvent


def event_json(ev: XidEvent) -> dict[str, Any]:
    """One event as the JSON object `logscan --json` prints (stable: add keys, never
    rename or drop)."""
    return {
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
            stream, close = _open(path)
        except OSError as e:
            typer.echo(f"gpuvigil logscan: cannot read {path}: {e.strerror or e}", err=True)
            raise typer.Exit(2) from e
        try:
            events = iter_stream(stream, year=year)
            if as_json:
                _print_json(events)
            else:
                _print_table(events, source=path)
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


def _print_json(events: Iterator[XidEvent]) -> None:
    out = sys.stdout
    out.write("[")
    sep = "\n  "
    for ev in events:
        out.write(sep)
        out.write(json.dumps(event_json(ev), ensure_ascii=False))
        sep = ",\n  "
    out.write("\n]\n" if sep != "\n  " else "]\n")
    out.flush()


def _print_table(events: Iterator[XidEvent], *, source: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Xid/SXid events in {'standard input' if source == '-' else source}")
    for col in ("#", "kind", "code", "PCI bus id", "timestamp", "process", "message"):
        table.add_column(col, overflow="fold", no_wrap=col in {"#", "kind", "code"})
    counts: Counter[str] = Counter()
    for n, ev in enumerate(events, 1):
        counts[f"{'SXid' if ev.kind == 'sxid' else 'Xid'} {ev.code}"] += 1
        proc = ev.process or ev.device or ""
        if ev.pid is not None:
            proc = f"{proc} ({ev.pid})"
        table.add_row(
            str(n),
            ev.kind,
            str(ev.code),
            ev.pci_bus_id,
            ev.timestamp or "",
            proc,
            ev.message,
        )
    console = Console(soft_wrap=False)
    if not counts:
        console.print("no Xid or SXid events found", markup=False)
        return
    console.print(table)
    summary = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
    console.print(f"{sum(counts.values())} event(s): {summary}", markup=False)
