"""`rdma link [show]` (iproute2) -> the same `FabricReading` as ibstat and sysfs. Pure;
never raises.

One line per port: `link mlx5_0/1 [subnet_prefix ... lid 3 sm_lid 1 lmc 0] state ACTIVE
physical_state LINK_UP [netdev ibp12s0]`. The fields are read by keyword, so a newer
iproute2 that adds or reorders fields reads alike. A port with a LID is InfiniBand; one
without is Ethernet (RoCE); `rdmap*`/`efa*` devices are EFA. The fabric rule then judges
port state, physical state and the adapter count (`rules.fabric`).
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from gpuvigil.node.checks.fabric.fabric_tools import _adapter, _phys, _reading, _state
from gpuvigil.node.checks.fabric.readings import FabricPort, FabricReading, NetDev

SOURCE = "rdma link"
_LINE = re.compile(r"^\s*(?:\d+/\d+:\s*)?link\s+(?P<dev>[\w.\-]+)/(?P<port>\d+)\s+(?P<rest>.*)$")


def looks_like(lines: list[str]) -> bool:
    head = "\n".join(lines[:200])
    if head.lstrip().startswith("[") and '"physical_state"' in head and '"ifname"' in head:
        return True  # `rdma -j link` (-p: pretty)
    sample = [ln for ln in lines[:100] if ln.strip()]
    ours = sum(1 for ln in sample if _LINE.match(ln) and " state " in f" {ln} ")
    return bool(sample) and ours * 2 >= len(sample)


def parse(text: str, *, taken_at: datetime | None = None) -> FabricReading:
    by_dev: dict[str, tuple[list[FabricPort], list[NetDev]]] = {}
    problems: list[str] = []
    for line in _json_lines(text, problems) if text.lstrip().startswith("[") else text.splitlines():
        m = _LINE.match(line)
        if m is None:
            if line.strip() and not line.lstrip().startswith(("#", "$")):
                problems.append(f"{SOURCE}: cannot read {line.strip()[:120]!r}")
            continue
        fields = _fields(m.group("rest"))
        dev = m.group("dev")
        ports, netdevs = by_dev.setdefault(dev, ([], []))
        efa = dev.startswith(("rdmap", "efa"))
        ib = "lid" in fields and not efa
        ports.append(
            FabricPort(
                number=int(m.group("port")),
                state=_state(fields.get("state")),
                phys_state=_phys(fields.get("physical_state")),
                rate_gbps=None,
                link_layer="Unspecified" if efa else "InfiniBand" if ib else "Ethernet",
            )
        )
        if "netdev" in fields and not ib:
            netdevs.append(NetDev(name=fields["netdev"], operstate=None, carrier=None))
    if not by_dev and not problems:
        problems.append(f"{SOURCE}: no 'link <dev>/<port> ... state ...' lines")
    adapters = [_adapter(dev, ports, netdevs=tuple(nds)) for dev, (ports, nds) in by_dev.items()]
    return _reading(adapters, problems, SOURCE, taken_at)


def _fields(rest: str) -> dict[str, str]:
    """`key value` pairs; a key with no value (a flag) maps to ''."""
    tokens = rest.split()
    out: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i]
        value = tokens[i + 1] if i + 1 < len(tokens) else ""
        out[key] = value
        i += 2
    return out


def _json_lines(text: str, problems: list[str]) -> list[str]:
    """`rdma -j link`: each object as the line the plain form prints, read the same way."""
    try:
        items = json.loads(text)
    except ValueError as e:
        problems.append(f"{SOURCE} -j: not JSON: {e}")
        return []
    lines = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or "ifname" not in item or "port" not in item:
            problems.append(f"{SOURCE} -j: not a link object: {str(item)[:120]!r}")
            continue
        keys = ("subnet_prefix", "lid", "sm_lid", "lmc", "state", "physical_state", "netdev")
        rest = " ".join(f"{k} {item[k]}" for k in keys if k in item)
        lines.append(f"link {item['ifname']}/{item['port']} {rest}")
    return lines
