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
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, tzinfo
from typing import TYPE_CHECKING, Any

from gpuvigil.core.cli_exit import CliExit
from gpuvigil.node.bus_ids import normalize_bus_id
from gpuvigil.node.capture.inputs import InputError, open_input
from gpuvigil.node.checks.kernel_log.kernel_log_parser import (
    EVENT_PATTERN,
    MONO_PATTERN,
    UNKNOWN_NAMES,
    EventFields,
    event_fields,
    iter_stream_fields,
    iter_xid_lines,
)
from gpuvigil.node.checks.kernel_log.kernel_log_shape import unreadable
from gpuvigil.node.checks.kernel_log.log_lines import LineStats
from gpuvigil.observe.printable import printable

if TYPE_CHECKING:
    import typer

    from gpuvigil.node.catalog.xid_base import BaseTable
    from gpuvigil.node.checks.kernel_log.readings import XidEvent

# Defaults of the options, shared by the typer command and `fast_path`.
DEFAULT_TZ, DEFAULT_READ_TIMEOUT, DEFAULT_MAX_BYTES = "UTC", 300.0, 16 * 1024**3


class Verdict(dict[str, Any]):
    """One event's verdict keys, with their JSON text (`json_tail`: the keys as the
    standard encoder writes them, without the opening brace) and whether its status is
    FAILED, made once per verdict."""

    json_tail: str = "}"
    failed: bool = False


class Verdicts:
    """Each event's own verdict from the catalog (base entries: the GPU's family is not
    known here), remembered per (kind, code, message): an Xid storm repeats a few texts,
    and the lookup is most of an event's cost after parsing."""

    def __init__(self) -> None:
        self._catalog: BaseTable | None = None
        self._seen: dict[tuple[str, int, str], Verdict] = {}

    @property
    def catalog(self) -> BaseTable:
        """Loaded at the first event: a log without one (most) never pays for it. The base
        entries resolved ahead (`xid_base`: a test holds them to the YAML), not the catalog
        itself, whose yaml and pydantic cost 0.15 s of start-up."""
        if self._catalog is None:
            from gpuvigil.node.catalog.xid_base import load_table

            self._catalog = load_table()
        return self._catalog

    def of(self, ev: XidEvent) -> Verdict:
        """The verdict keys of `logscan --json` for one event (shared: do not change)."""
        return self.of_text(ev.kind, ev.code, ev.message)

    def of_text(self, kind: str, code: int, message: str) -> Verdict:
        """`of` for an event's kind, code and message (its `EventFields`)."""
        key = (kind, code, message)
        hit = self._seen.get(key)
        if hit is None:
            rule = self.catalog.rule(kind, code)
            verdict = rule.outcome_for(message)
            hit = Verdict(
                mnemonic=rule.name,
                in_catalog=rule.known,
                status=verdict.status,
                action=verdict.action,
                fatal=verdict.fatal,
            )
            hit.json_tail = _ENCODE(hit)[1:]
            hit.failed = hit["status"] == "FAILED"
            if len(message) <= _MEMO_TEXT:  # memory stays bounded on a hostile log
                if len(self._seen) >= _MEMO_SIZE:
                    self._seen.clear()
                self._seen[key] = hit
        return hit


_MEMO_SIZE, _MEMO_TEXT = 4096, 512


def event_json(ev: XidEvent, verdict: dict[str, Any] | None = None) -> dict[str, Any]:
    """One event as the JSON object `logscan --json` prints (stable: add keys, never
    rename or drop). With its verdict (`Verdicts.of`), the event's own verdict is added."""
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
    if verdict is not None:
        out.update(verdict)
    return out


def event_text(ev: XidEvent, verdict: Verdict | None = None) -> str:
    """`event_json(ev, verdict)` as the standard encoder writes it (the same text, a test
    holds them equal), written straight from the fields: building and encoding a 19-key
    dict per event was half of an Xid storm's cost."""
    fields = (ev.kind, ev.code, ev.pci_bus_id, ev.bus_id, ev.message, ev.line, ev.timestamp,
              ev.time, ev.uptime_s, ev.source, ev.seq, ev.pid, ev.process, ev.device)  # fmt: skip
    return fields_text(fields, verdict)


def fields_text(fields: EventFields, verdict: Verdict | None = None) -> str:
    """`event_text` of an event's `EventFields` (what `--json` parses each line into)."""
    kind, code, pci, bus_id, message, line, stamp, when, up, _, seq, pid, proc, dev = fields
    # The common types tested inline (a call of `_optional` per field cost a tenth of it).
    s, opt, inf = _STRING, _optional, math.inf
    number = int.__repr__(code)
    finding = ("SXID_" if kind == "sxid" else "XID_") + number  # XidEvent.code_name
    return (
        f'{{"kind": {s(kind)}, "code": {number}, "pci_bus_id": {s(pci)}, '
        f'"timestamp": {s(stamp) if type(stamp) is str else opt(stamp)}, '
        f'"message": {s(message)}, "finding_code": {s(finding)}, '
        f'"bus_id": {s(bus_id) if type(bus_id) is str else opt(bus_id)}, '
        f'"time": {"null" if when is None else s(when.isoformat())}, '
        f'"uptime_s": {float.__repr__(up) if type(up) is float and -inf < up < inf else opt(up)}, '
        f'"pid": {int.__repr__(pid) if type(pid) is int else opt(pid)}, '
        f'"process": {s(proc) if type(proc) is str else opt(proc)}, '
        f'"device": {"null" if dev is None else opt(dev)}, '
        f'"seq": {"null" if seq is None else opt(seq)}, '
        f'"line": {s(line)}' + (f", {verdict.json_tail}" if verdict is not None else "}")
    )


def _optional(v: str | float | None) -> str:
    """A JSON scalar as `json` writes it: null, a string, an int, a float (repr)."""
    if v is None:
        return "null"
    if type(v) is str:
        return _STRING(v)
    if type(v) is int or (type(v) is float and abs(v) < math.inf):
        return repr(v)  # what `json` writes for a finite number
    return _ENCODE(v)  # NaN, Infinity, a subclass: as the encoder has it


def register(app: typer.Typer) -> None:
    import typer  # here, not at the top: `fast_path` runs without it

    @app.command("logscan")
    def logscan(  # noqa: PLR0917 - typer maps every option to a parameter
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
            DEFAULT_TZ,
            "--tz",
            help="IANA time zone of stamps printed without an offset (dmesg -T, syslog); "
            "used for the 'time' field.",
        ),
        read_timeout: float = typer.Option(
            DEFAULT_READ_TIMEOUT,
            "--read-timeout",
            min=0.1,
            help="Seconds to read the whole input (a FIFO with no writer ends here, exit 2).",
        ),
        max_bytes: int = typer.Option(
            DEFAULT_MAX_BYTES,
            "--max-bytes",
            min=1,
            help="Read at most this many bytes (after gzip/UTF-16 decoding); more is exit 2.",
        ),
    ) -> None:
        """Every NVIDIA Xid (GPU) and SXid (NVSwitch) event in a kernel log, in order.

        One event per log line: a line where the driver printed `Xid (PCI:<bus>): <code>`.

        Mentions such as "caused by previous Xid 149" are not events.

        Reads plain, gzip and UTF-16 logs, bare-CR line ends, lines of any length,
        in bounded memory; escape sequences in the log are shown, not played.

        Exit: 1 when an event's own verdict is FAILED, also when the input is over
        --max-bytes (a definite failure wins, as in analyze); else 2 when the input
        could not be read or told (missing, stdin closed, no data before
        --read-timeout, over --max-bytes, empty, binary, not a kernel log); else 0.

        Examples:

          sudo dmesg --time-format iso | gpuvigil logscan -

          journalctl -k -b -1 | gpuvigil logscan - --json > xids.json

          gpuvigil logscan /var/log/kern.log --year 2026
        """
        raise typer.Exit(
            run(path, as_json=as_json, year=year, tz=tz, read_timeout=read_timeout,
                max_bytes=max_bytes)
        )  # fmt: skip


def run(
    path: str, *, as_json: bool, year: int | None, tz: str, read_timeout: float, max_bytes: int
) -> CliExit:
    """The command itself, without typer: its exit status, from the one table (`CliExit`).
    `fast_path` calls it straight from the argv it understands (typer and the pydantic it
    needs cost 0.2 s of start-up, more than the scan of an ordinary 200 MB log); the typer
    command calls it too."""
    zone = _zone(tz)
    if zone is None:
        _err(f"gpuvigil logscan: unknown time zone {tz!r}")
        return CliExit.CANNOT_TELL
    try:
        stream = open_input(path, timeout_s=read_timeout)
    except InputError as e:
        _err(f"gpuvigil logscan: {e}")
        return CliExit.CANNOT_TELL
    stats = LineStats(count_lines=False)  # not reported: spare the scan
    verdicts = Verdicts()
    try:
        with stream:
            if as_json:
                events = _counted(iter(()), verdicts)
                _print_json(iter_xid_lines(stream, stats=stats), events, tz=zone, year=year)
            else:
                events = _counted(
                    iter_stream_fields(stream, year=year, tz=zone, stats=stats), verdicts
                )
                from gpuvigil.node.checks.kernel_log.readings import XidEvent

                _print_table(((XidEvent(*f), v) for f, v in events), source=path)
    except BrokenPipeError:  # `gpuvigil logscan big.log | head`: the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CliExit.OK
    except InputError as e:
        _err(f"gpuvigil logscan: {e}")
        return CliExit.CANNOT_TELL
    # The one exit rule (`analyze`'s too, NodeReport.exit_code): a definite failure wins
    # over "could not tell" (a FAILED event before the size cap is already enough).
    told = True
    if stats.bytes_read > max_bytes:
        _err(f"gpuvigil logscan: {path} is over --max-bytes {max_bytes}")
        told = False
    why = unreadable(found=events.count > 0, stats=stats)
    if why is not None:
        _err(f"gpuvigil logscan: could not tell: {why}")
        told = False
    if events.failed:
        return CliExit.FAILED
    return CliExit.OK if told else CliExit.CANNOT_TELL


def _zone(tz: str) -> tzinfo | None:
    """The zone named `tz`, None when there is none. The default, UTC, is
    `datetime.UTC`: the same offsets and text as `ZoneInfo("UTC")`, without importing
    zoneinfo (5 ms of start-up)."""
    if tz == "UTC":
        return UTC
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _err(message: str) -> None:
    """`typer.echo(message, err=True)`: the same bytes. click strips ANSI escapes off a
    stream that is not a terminal, so a message holding one still goes through it."""
    if "\x1b" in message:
        import typer

        typer.echo(message, err=True)
        return
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


# The options `fast_path` reads itself: name -> (parse, the least value typer allows).
_INT, _FLOAT = re.compile(r"[0-9]{1,18}"), re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9})?")
_OPTIONS: dict[str, tuple[re.Pattern[str] | None, type, float | None]] = {
    "--year": (_INT, int, None),
    "--tz": (None, str, None),
    "--read-timeout": (_FLOAT, float, 0.1),
    "--max-bytes": (_INT, int, 1),
}


def fast_path(argv: list[str]) -> int | None:
    """`gpuvigil logscan ...` run without typer when every word of `argv` is one that
    typer would read the same way: `logscan`, one FILE (or `-`), `--json`, and the options
    above with a plain value (`--opt V` or `--opt=V`, each once). Anything else (help, a
    typo, `--`, a value typer might coerce or reject) returns None: typer runs it, with its
    messages. Returns the exit status."""
    if argv[:1] != ["logscan"]:
        return None
    opts: dict[str, Any] = {"as_json": False, "year": None, "tz": DEFAULT_TZ,
                            "read_timeout": DEFAULT_READ_TIMEOUT,
                            "max_bytes": DEFAULT_MAX_BYTES}  # fmt: skip
    seen: set[str] = set()
    path: str | None = None
    words = iter(argv[1:])
    for word in words:
        name, eq, value = word.partition("=")
        if word == "--json" and word not in seen:
            opts["as_json"] = True
        elif name in _OPTIONS and name not in seen:
            if not eq:
                value = next(words, None)
                if value is None or value.startswith("-"):
                    return None
            shape, kind, least = _OPTIONS[name]
            if (shape is not None and shape.fullmatch(value) is None) or not value:
                return None
            parsed = kind(value)
            if least is not None and parsed < least:
                return None
            opts[name[2:].replace("-", "_")] = parsed
        elif path is None and (word == "-" or not word.startswith("-")):
            path = word
        else:
            return None
        seen.add(name if eq else word)
    if path is None:
        return None
    try:
        return run(path, **opts)
    except KeyboardInterrupt:  # as typer ends a command on Ctrl-C: quietly, status 130
        return 130


class _counted:
    """The events as they stream by, remembered only as counts (memory stays flat)."""

    def __init__(self, events: Iterator[EventFields], verdicts: Verdicts) -> None:
        self.events, self.verdicts = events, verdicts
        self.count, self.failed = 0, False

    def __iter__(self) -> Iterator[tuple[EventFields, Verdict]]:
        of = self.verdicts.of_text
        for fields in self.events:
            self.count += 1
            verdict = of(fields[0], fields[1], fields[4])  # kind, code, message
            if verdict.failed:
                self.failed = True
            yield fields, verdict


def _print_json(
    lines: Iterator[tuple[str, int]], events: _counted, *, tz: tzinfo, year: int | None
) -> None:
    """`_counted`'s loop inline (one generator step less per event on an Xid storm); the
    common line written by `_common_text`, any other by `fields_text`."""
    out, of = sys.stdout, events.verdicts.of_text
    write, sep, count, failed = out.write, "[\n  ", 0, False
    for line, at in lines:  # written as found: a live log's events show as they come
        found = _common_text(line, at, of)
        if found is None:
            fields = event_fields(line, at, tz=tz, year=year)
            if fields is None:
                continue
            verdict = of(fields[0], fields[1], fields[4])  # kind, code, message
            found = fields_text(fields, verdict), verdict
        count += 1
        failed = failed or found[1].failed
        write(sep + found[0])
        sep = ",\n  "
    events.count += count
    events.failed = events.failed or failed
    write("\n]\n" if sep != "[\n  " else "[]\n")
    out.flush()


def _common_text(
    line: str, at: int, of: Callable[[str, int, str], Verdict]
) -> tuple[str, Verdict] | None:
    """`fields_text` of `event_fields(line, at)` and its verdict, for the common line: a
    raw dmesg stamp (`[  123.456789]`) before the event, and a numeric code. None for any
    other line (the general path decides). The same steps as `_fields` on that branch,
    the JSON written straight from them: no 14-field tuple, no type tests (a test holds
    the two paths to the same text); 7.3 us an event -> 6 us."""
    if line[:1] != "[":
        return None
    start = at - 1 if at > 0 and line.find("nvidia-nvswitch", 0, at) < 0 else 0
    m = _EVENT_SEARCH(line, start)
    if m is None:
        return None
    device, s, pci, code_text, _, pid_text, name, message = m.groups()
    head_end = m.start()
    if code_text is None or (device and not s) or line.find("kern:", 0, head_end) >= 0:
        return None
    mono = _MONO_MATCH(line, 0, head_end)  # as `_MONO.match(head)`: nothing looks past it
    if mono is None:
        return None
    stamp = mono.group(1)
    pid = proc = None
    if pid_text is not None:
        pid_text = pid_text.strip("'")
        pid = int(pid_text) if pid_text.isdigit() else None
        if name is not None:
            name = name.strip()
            if name not in UNKNOWN_NAMES:
                proc = name
    message = message.strip()
    bus_id = normalize_bus_id(pci)
    code = int(code_text)
    verdict = of(kind := "sxid" if s else "xid", code, message)
    st, number = _STRING, int.__repr__(code)
    return (
        f'{{"kind": "{kind}", "code": {number}, "pci_bus_id": {st(pci)}, '
        f'"timestamp": {st(stamp)}, "message": {st(message)}, '
        f'"finding_code": "{"SXID_" if s else "XID_"}{number}", '
        f'"bus_id": {"null" if bus_id is None else st(bus_id)}, "time": null, '
        f'"uptime_s": {float.__repr__(float(stamp))}, '
        f'"pid": {"null" if pid is None else int.__repr__(pid)}, '
        f'"process": {"null" if proc is None else st(proc)}, '
        f'"device": {"null" if device is None else st(device)}, "seq": null, '
        f'"line": {st(line)}, {verdict.json_tail}'
    ), verdict


# One encoder for every event: json.dumps builds a new one per call when given options.
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
_STRING = json.encoder.encode_basestring  # what that encoder writes a str with (C)
_EVENT_SEARCH, _MONO_MATCH = EVENT_PATTERN.search, MONO_PATTERN.match


TABLE_MAX_ROWS = 1000  # rich lays a table out row by row (~3 ms each); more go plain


def _row(n: int, ev: XidEvent, verdict: dict[str, Any]) -> tuple[str, ...]:
    proc = ev.process or ev.device or ""
    if ev.pid is not None:
        proc = f"{proc} ({ev.pid})"
    text = f"{verdict['status']} {verdict['action']}{' fatal' if verdict['fatal'] else ''}"
    if not verdict["in_catalog"]:
        text += " (not in catalog)"
    return tuple(
        printable(cell)
        for cell in (
            str(n),
            ev.kind,
            str(ev.code),
            ev.pci_bus_id,
            ev.timestamp or "",
            proc,
            text,
            ev.message,
        )
    )


_COLUMNS = ("#", "kind", "code", "PCI bus id", "timestamp", "process", "verdict", "message")


def _print_table(events: Iterable[tuple[XidEvent, dict[str, Any]]], *, source: str) -> None:
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
    for n, (ev, verdict) in enumerate(events, 1):
        counts[f"{'SXid' if ev.kind == 'sxid' else 'Xid'} {ev.code}"] += 1
        rows.append(_row(n, ev, verdict))
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

        where = "standard input" if source == "-" else printable(source)
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
