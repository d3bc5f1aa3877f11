"""Fabric Manager's own words -> `FabricManagerLog`. Pure; never raises.

Reads the three shapes people paste: the `nv-fabricmanager` journal (`journalctl -u
nvidia-fabricmanager`, with systemd's start/stop lines and `nvidia-fabricmanager-start.sh`
on r550+ packages), FM's log file (`/var/log/fabricmanager.log`: `[Feb 27 2025 15:10:02]
[ERROR] [tid 12727] ...`, also found inside journal lines), and `systemctl status
nvidia-fabricmanager` (its `Active:` line), and systemctl's own answer to a start that
failed (`Job for nvidia-fabricmanager.service failed because ...`, `Failed to start
nvidia-fabricmanager.service: Unit ... is masked.`), shell prompts around it or not.
Lines of other processes are not FM's and are
skipped. Every FM line that says an error is an event: a line this reader does not know
is never taken for healthy.
"""

from __future__ import annotations

import re

from gpuvigil.node.checks.fabric_manager.readings import FabricManagerLog, FmEvent, FmEventKind

MAX_EVENTS = 500

# `[Feb 27 2025 15:10:02] [ERROR] [tid 12727] message` (the log file's own stamp and level)
_FILE = re.compile(
    r"\[(?P<ts>[A-Z][a-z]{2} +\d+ \d{4} [\d:]+)\] \[(?P<level>[A-Z]+)\] (?P<msg>.*)$"
)
# A journal or syslog line: "<stamp> <host> <process>[<pid>]: <message>".
# Bounded stamp and host: unbounded `.*?` then `\S+` backtracked quadratically on a long
# line with no ": " (a 64 KiB head of NUL bytes took minutes).
_JOURNAL = re.compile(
    r"^(?P<ts>.{0,80}?)\s*\S{1,255}\s+(?P<proc>[\w.@-]{1,128})(?:\[\d+\])?:\s(?P<msg>.*)$"
)
_ACTIVE = re.compile(r"^\s*Active:\s*(?P<state>\S+)(?:\s+\((?P<sub>[^)]*)\))?(?P<rest>.*)$")
# systemctl's answer when it could not start the unit (said by systemctl, not the journal).
_SYSTEMCTL = re.compile(
    r"^(?:Job for (?:nvidia-fabricmanager|nv-fabricmanager)\S* failed\b"
    r"|Failed to (?:re)?start (?:nvidia-fabricmanager|nv-fabricmanager)\S*:)",
    re.I,
)
_KERNEL = re.compile(r"NVRM:|\bS?Xid \(|nvidia-nvswitch\d*:")
# FM's own message with no stamp or process name, as a log collector relays it behind a
# `<host>: ` prefix (Talos: `10.0.0.5: fabric manager config file item: ...`), the host
# often redacted in a paste (`<node ip>: `), or bare.
_BARE = re.compile(
    r"^(?:(?:<[^<>]{1,40}>|[\w.:-]{1,255}):\s+)?(?P<msg>(?:nvidia )?fabric ?manager\b.*)$", re.I
)
_UNIT = re.compile(r"nvidia-fabricmanager(?:\.service)?\b|nv-fabricmanager", re.I)

_SXID = re.compile(r"detected NVSwitch (?P<class>non-fatal|fatal) error (?P<code>\d+)", re.I)
_SWITCH = re.compile(r"pci bus id (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)")
_FAILED = re.compile(
    r"Failed with result|Failed to start|Control process exited, code=\w+, status=(?!0/)"
    r"|Main process exited, code=\w+, status=(?!0/)|failed! Exit code: [1-9]"
    r"|terminat(?:ed|ing) abnormally|exiting (?:due to|with) (?:an )?error"
    r"|failed to (?:start|initiali[sz]e)|initiali[sz]ation (?:has )?failed|\baborting\b"
    r"|^Job for \S+ failed\b",
    re.I,
)
_STARTED = re.compile(
    r"Started NVIDIA fabric manager|Successfully configured all the available"
    r"|NVIDIA Fabric Manager service started",
    re.I,
)
_STOPPED = re.compile(r"Stopped NVIDIA fabric manager|Stopping NVIDIA fabric manager", re.I)
_ERRORISH = re.compile(
    r"\b(?:error|errors|failed|failure|fatal|unable|cannot|could not|timed? ?out|invalid)\b"
    r"|\[NV_(?:ERR|WARN)_\w+\]",
    re.I,
)


def looks_like(lines: list[str]) -> bool:
    """Most of the lines are Fabric Manager's (a journal of its unit, its log file, or
    `systemctl status` of it), and no NVIDIA kernel-driver line (NVRM, an Xid or an
    NVSwitch SXid) is there: a journal with those is a kernel log first."""
    sample = [ln for ln in lines[:200] if ln.strip()]
    if not sample or any(_KERNEL.search(ln) for ln in lines[:2000]):
        return False
    ours = sum(1 for ln in sample if _fm_text(ln) is not None)
    if any(_SYSTEMCTL.match(ln.strip()) for ln in sample):
        return True  # systemctl's own failure answer for the unit, prompts around it
    return ours * 2 >= len(sample) or (
        _UNIT.search(sample[0]) is not None and ours >= 1 and sample[0].lstrip().startswith("●")
    )


def parse(text: str) -> FabricManagerLog:
    events: list[FmEvent] = []
    read = 0
    shapes: set[str] = set()
    for raw in text.splitlines():
        found = _fm_text(raw)
        if found is None:
            continue
        read += 1
        shape, stamp, level, msg = found
        shapes.add(shape)
        event = _event(msg, level, stamp, raw.strip())
        if event is not None and len(events) < MAX_EVENTS:
            events.append(event)
    source = (
        "systemctl status"
        if shapes & {"status", "systemctl"}
        else ("journal" if "journal" in shapes else "log file")
    )
    return FabricManagerLog(events=tuple(events), lines_read=read, source=source)


def _fm_text(raw: str) -> tuple[str, str | None, str | None, str] | None:
    """(shape, stamp, level, message) of a Fabric Manager line, or None."""
    line = raw.strip()
    if not line:
        return None
    if _SYSTEMCTL.match(line):
        return "systemctl", None, None, line
    active = _ACTIVE.match(line)
    if active:
        return "status", None, None, f"Active: {active.group('state')} ({active.group('sub')})"
    m = _FILE.search(line)
    if m and line.startswith("["):
        return "file", m.group("ts"), m.group("level"), m.group("msg")
    bare = _BARE.match(line)
    if bare:
        return "file", None, None, bare.group("msg")
    j = _JOURNAL.match(line)
    if j is None:
        return None
    proc, msg = j.group("proc"), j.group("msg")
    if "fabricmanager" not in proc.lower() and not (
        proc.startswith("systemd") and (_UNIT.search(msg) or "fabric manager" in msg.lower())
    ):
        return None
    inner = _FILE.search(msg)
    if inner:
        return "journal", inner.group("ts"), inner.group("level"), inner.group("msg")
    return "journal", j.group("ts") or None, None, msg


def _event(msg: str, level: str | None, stamp: str | None, line: str) -> FmEvent | None:
    kind: FmEventKind | None = None
    sxid = _SXID.search(msg)
    if sxid:
        kind = "sxid_fatal" if sxid.group("class").lower() == "fatal" else "sxid_nonfatal"
        bus = _SWITCH.search(msg)
        return FmEvent(
            kind=kind,
            line=line[:400],
            timestamp=stamp,
            sxid=int(sxid.group("code")),
            switch=bus.group("bus").upper() if bus else None,
        )
    if msg.startswith("Active: "):
        state = msg.split()[1].lower()
        kind = (
            "started"
            if state in ("active", "activating", "reloading")
            else "failed"
            if state == "failed"
            else "stopped"
        )
    elif _FAILED.search(msg) or (level or "").upper() in ("FATAL", "CRITICAL"):
        kind = "failed"
    elif _STOPPED.search(msg):
        kind = "stopped"
    elif _STARTED.search(msg):
        kind = "started"
    elif (level or "INFO").upper() not in ("INFO", "DEBUG") or _ERRORISH.search(msg):
        kind = "error"  # ERROR/WARNING levels, and error words at any level
    if kind is None:
        return None
    return FmEvent(kind=kind, line=line[:400], timestamp=stamp)
