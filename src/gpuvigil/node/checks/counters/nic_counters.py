"""NIC error counters from pasted outputs -> `NicCounters`. Pure; never raises.

- `perfquery [-x] [-e] [lid port]`: a `# Port counters: Lid 3 port 1 ...` banner (or `Port
  extended counters`, `PortRcvErrorDetails counters`) then `SymbolErrorCounter:....0`
  lines. Names are turned into the sysfs counter names (`symbol_error`, `link_downed`,
  `port_rcv_errors`, ...) so one threshold table serves both.
- `ethtool -S <if>`: `NIC statistics:` then `     rx_crc_errors_phy: 0`; per-queue lines
  (`rxq0: rx_bytes: 1`, `[0]: rx_bytes: 1`) keep their prefix. Several `ethtool -S`
  outputs pasted together are told apart by their `ethtool -S <if>` command lines.
"""

from __future__ import annotations

import re

from gpuvigil.node.checks.counters.readings import NicCounters, PortCounters

MAX_PORTS = 256
MAX_COUNTERS = 4096

_PQ_BANNER = re.compile(
    r"^#\s*(?P<what>[\w ]*?)counters:\s*Lid\s+(?P<lid>\d+)\s+port\s+(?P<port>\d+)", re.I | re.M
)
_PQ_LINE = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*):\.*\s*(?P<value>\S+)\s*$")
_ETH_CMD = re.compile(r"ethtool\s+(?:-S|--statistics)\s+(?P<dev>\S+)")
_ETH_LINE = re.compile(
    r"^\s*(?P<name>(?:\[\d+\]:\s*|\w+:\s+)?[\w.\-/]+):\s+(?P<value>-?\d+)\s*(?:#.*)?$"
)

# perfquery's names -> the names of /sys/class/infiniband/*/ports/*/counters.
_PQ_NAMES = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait",
}
_PQ_NOT_COUNTERS = ("PortSelect", "CounterSelect", "CounterSelect2")


def looks_like(text: str) -> str | None:
    """ "perfquery" or "ethtool" when the text carries that tool's marks."""
    if _PQ_BANNER.search(text) and re.search(r"^\w+:\.{3,}", text, re.M):
        return "perfquery"
    if re.search(r"^\s*NIC statistics:\s*$", text, re.M):
        return "ethtool"
    return None


def parse(text: str) -> NicCounters:
    return _perfquery(text) if looks_like(text) == "perfquery" else _ethtool(text)


def _perfquery(text: str) -> NicCounters:
    ports: list[tuple[str, dict[str, int]]] = []
    problems: list[str] = []
    for line in text.splitlines():
        banner = _PQ_BANNER.match(line.strip())
        if banner:
            name = f"lid {banner.group('lid')} port {banner.group('port')}"
            ports.append((name, {}))
            continue
        m = _PQ_LINE.match(line.strip())
        if m is None or not ports or m.group("name") in _PQ_NOT_COUNTERS:
            continue
        raw = m.group("value")
        if not re.fullmatch(r"\d{1,20}", raw):
            problems.append(f"{ports[-1][0]}: {m.group('name')} = {raw!r}")
            continue
        name = _PQ_NAMES.get(m.group("name"), _snake(m.group("name")))
        # Several banners for one port (-x then -e): one port, the counters merged.
        ports[-1][1][name] = int(raw)
    return _counters("perfquery", ports, problems)


def _ethtool(text: str) -> NicCounters:
    ports: list[tuple[str, dict[str, int]]] = []
    device: str | None = None
    problems: list[str] = []
    for line in text.splitlines():
        cmd = _ETH_CMD.search(line)
        if cmd:
            device = cmd.group("dev")
            continue
        if re.match(r"^\s*NIC statistics:\s*$", line):
            ports.append((device or f"nic{len(ports)}", {}))
            device = None
            continue
        m = _ETH_LINE.match(line)
        if m is None or not ports:
            continue
        name = re.sub(r"\s+", " ", m.group("name"))
        if len(ports[-1][1]) < MAX_COUNTERS:
            ports[-1][1][name] = int(m.group("value"))
    if not any(c for _, c in ports):
        problems.append("ethtool -S: no 'name: value' counter lines")
    return _counters("ethtool -S", ports, problems)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _counters(source: str, ports: list[tuple[str, dict[str, int]]], problems: list[str]):
    merged: dict[str, dict[str, int]] = {}
    for name, counters in ports:
        merged.setdefault(name, {}).update(counters)
    rows = tuple(
        PortCounters(name=name, counters=tuple(c.items()))
        for name, c in list(merged.items())[:MAX_PORTS]
    )
    if not rows and not problems:
        problems.append(f"{source}: no port counters")
    return NicCounters(source=source, ports=rows, problems=tuple(problems[:50]))
