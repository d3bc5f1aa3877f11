"""What the RDMA tools print -> the same FabricReading the sysfs probe builds. Pure.

- `ibstat`: `CA 'mlx5_0'` blocks, `Port 1:` with `State: Active`, `Physical state:
  LinkUp`, `Rate: 400`, `Link layer: InfiniBand`; a trailing `ibpanic: ... stat of IB
  device 'mlx5_8' failed` means the listing stopped there (a problem: could not tell).
  An excerpt that starts at a `Port 1:` block (no `CA` line) is read as one adapter named
  `?`: its ports' states are facts, its name is not in the paste.
- `ibstatus`: `Infiniband device 'mlx5_0' port 1 status:` with `state: 4: ACTIVE`,
  `phys state: 5: LinkUp`, `rate: 400 Gb/sec (4X NDR)`, `link_layer: InfiniBand`.
- `ibv_devinfo [-v]`: `hca_id: mlx5_0`, `port: 1`, `state: PORT_ACTIVE (4)`,
  `link_layer: Ethernet`; only `-v` prints `phys_state: LINK_UP (5)`.
- `ibdev2netdev [-v]`: `mlx5_0 port 1 ==> ib0 (Up)`; `-v` adds the port state `(ACTIVE)`.
  The `(Up)`/`(Down)` is the network interface: for an IPoIB interface (`ib*`) it says
  nothing about the RDMA port (a pure-IB fabric has them all Down), for an Ethernet one
  (RoCE) it is the link.
- `fi_info -p efa`: `domain: rdmap79s0-rdm` per endpoint (a device appears once per
  endpoint type and fabric), also behind mpirun's `[1,0]<stdout>:` prefixes, where each
  rank is a node of its own.

Every reader never raises: text it cannot place is a `problem` of the reading, and the
fabric rules turn problems into CHECK_ERROR (could not tell).
"""

from __future__ import annotations

import re
from datetime import datetime

from gpuvigil.core.findings import utcnow
from gpuvigil.node.checks.fabric.readings import (
    FabricAdapter,
    FabricPort,
    FabricReading,
    FiInfo,
    NetDev,
)

_IBSTAT_STATE = {"active": "ACTIVE", "down": "DOWN", "initializing": "INIT", "armed": "ARMED"}
_PHYS = {
    "linkup": "LinkUp",
    "link_up": "LinkUp",
    "polling": "Polling",
    "disabled": "Disabled",
    "sleep": "Sleep",
    "portconfigurationtraining": "PortConfigurationTraining",
    "linkerrorrecovery": "LinkErrorRecovery",
    "phytest": "PhyTest",
}
_KEY = re.compile(r"^\s*([A-Za-z_][\w ]*?)\s*:\s*(.*?)\s*$")
MAX_ADAPTERS = 256  # more than any node has: the rest is not one node's output
MAX_PORTS = 16
MAX_PROBLEMS = 20
_RANK = re.compile(r"^\s*\[(\d+),(\d+)\]<std(?:out|err)>:\s?")


def _state(text: str | None) -> str | None:
    """'Active', '4: ACTIVE', 'PORT_ACTIVE (4)' -> 'ACTIVE'."""
    if not text:
        return None
    word = re.sub(r"\(\d+\)|^\d+\s*:", "", text).strip().upper().removeprefix("PORT_")
    word = {"INITIALIZING": "INIT"}.get(word, word)
    return word if re.fullmatch(r"[A-Z_]+", word) else None


def _phys(text: str | None) -> str | None:
    """'LinkUp', '5: LinkUp', 'LINK_UP (5)' -> 'LinkUp'."""
    if not text:
        return None
    word = re.sub(r"\(\d+\)|^\d+\s*:", "", text).strip()
    return _PHYS.get(word.replace(" ", "").lower(), word or None)


def _rate(text: str | None) -> float | None:
    m = re.match(r"^\s*(\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def _kind(name: str, link_layers: set[str | None]) -> str:
    if name.startswith(("rdmap", "efa")):
        return "efa"
    return "roce" if link_layers == {"Ethernet"} else "ib"


def _reading(
    adapters: list[FabricAdapter], problems: list[str], source: str, taken_at: datetime | None
) -> FabricReading:
    """The reading, bounded: a hostile output cannot make thousands of findings."""
    if len(adapters) > MAX_ADAPTERS:
        problems.append(f"{source}: {len(adapters)} adapters listed: more than one node has")
        adapters = adapters[:MAX_ADAPTERS]
    if len(problems) > MAX_PROBLEMS:
        problems = [*problems[:MAX_PROBLEMS], f"... and {len(problems) - MAX_PROBLEMS} more"]
    return FabricReading(
        taken_at=taken_at or utcnow(),
        adapters=tuple(adapters),
        problems=tuple(problems),
        source=source,
    )


def _adapter(name: str, ports: list[FabricPort], **kw: object) -> FabricAdapter:
    return FabricAdapter(
        name=name,
        kind=_kind(name, {p.link_layer for p in ports}),
        ports=tuple(ports[:MAX_PORTS]),
        **kw,  # type: ignore[arg-type]
    )


def parse_ibstat(text: str, *, taken_at: datetime | None = None) -> FabricReading:
    cas: list[tuple[str, dict[str, str], list[dict[str, str]]]] = []
    problems: list[str] = []
    for line in text.splitlines():
        ca = re.match(r"^CA '([^']+)'", line)
        if ca:
            cas.append((ca.group(1), {}, []))
            continue
        if re.match(r"^\s*ibpanic:|^\s*ibwarn:|^\s*stat of", line):
            problems.append(f"ibstat: {line.strip()[:200]}")
            continue
        port = re.match(r"^\s*Port (\d+):\s*$", line)
        if port and not cas:
            cas.append(("?", {}, []))  # an excerpt from inside a CA block
        if port and cas:
            cas[-1][2].append({"number": port.group(1)})
            continue
        kv = _KEY.match(line)
        if kv and cas:
            target = cas[-1][2][-1] if cas[-1][2] else cas[-1][1]
            target[kv.group(1).lower()] = kv.group(2)
    adapters = []
    for name, attrs, ports in cas:
        read = [
            FabricPort(
                number=int(p["number"]),
                state=_IBSTAT_STATE.get(p.get("state", "").lower(), _state(p.get("state"))),
                phys_state=_phys(p.get("physical state")),
                rate_gbps=_rate(p.get("rate")),
                link_layer=p.get("link layer"),
                problems=_missing(p, ("state", "physical state"), f"{name} port {p['number']}"),
            )
            for p in ports
        ]
        adapters.append(_adapter(name, read, hca_type=attrs.get("ca type")))
    if not adapters and not problems:
        problems.append("ibstat: no CA blocks in the output")
    return _reading(adapters, problems, "ibstat", taken_at)


def parse_ibstatus(text: str, *, taken_at: datetime | None = None) -> FabricReading:
    by_dev: dict[str, list[FabricPort]] = {}
    problems: list[str] = []
    current: dict[str, str] | None = None
    blocks: list[tuple[str, int, dict[str, str]]] = []
    for line in text.splitlines():
        head = re.match(r"^Infiniband device '([^']+)' port (\d+) status:", line)
        if head:
            current = {}
            blocks.append((head.group(1), int(head.group(2)), current))
            continue
        kv = _KEY.match(line)
        if kv and current is not None:
            current[kv.group(1).lower()] = kv.group(2)
    for dev, number, attrs in blocks:
        by_dev.setdefault(dev, []).append(
            FabricPort(
                number=number,
                state=_state(attrs.get("state")),
                phys_state=_phys(attrs.get("phys state")),
                rate_gbps=_rate(attrs.get("rate")),
                link_layer=attrs.get("link_layer"),
                problems=_missing(attrs, ("state", "phys state"), f"{dev} port {number}"),
            )
        )
    if not blocks:
        problems.append("ibstatus: no 'Infiniband device' blocks in the output")
    adapters = [_adapter(dev, ports) for dev, ports in by_dev.items()]
    return _reading(adapters, problems, "ibstatus", taken_at)


def parse_ibv_devinfo(text: str, *, taken_at: datetime | None = None) -> FabricReading:
    hcas: list[tuple[str, dict[str, str], list[dict[str, str]]]] = []
    problems: list[str] = []
    for line in text.splitlines():
        kv = _KEY.match(line)
        if kv is None:
            continue
        key, value = kv.group(1).lower(), kv.group(2)
        if key == "hca_id":
            hcas.append((value, {}, []))
        elif key == "port" and hcas and value.isdigit():
            hcas[-1][2].append({"number": value})
        elif hcas:
            (hcas[-1][2][-1] if hcas[-1][2] else hcas[-1][1]).setdefault(key, value)
    if re.search(r"No IB devices found|Failed to get IB devices list", text, re.I):
        problems.append("ibv_devinfo: " + text.strip().splitlines()[0][:200])
    adapters = []
    for name, attrs, ports in hcas:
        read = [
            FabricPort(
                number=int(p["number"]),
                state=_state(p.get("state")),
                phys_state=_phys(p.get("phys_state")),  # only with -v
                rate_gbps=None,
                link_layer=p.get("link_layer"),
                problems=_missing(p, ("state",), f"{name} port {p['number']}"),
            )
            for p in ports
        ]
        hca = "efa" if attrs.get("transport", "").lower().startswith("unspecified") else None
        adapters.append(_adapter(name, read, hca_type=hca or attrs.get("vendor_part_id")))
    if not hcas and not problems:
        problems.append("ibv_devinfo: no hca_id blocks in the output")
    return _reading(adapters, problems, "ibv_devinfo", taken_at)


# `-v` pads the port state to the width of ACTIVE: "port 1 (DOWN  ) ==> ib2 (Down)".
_I2N = re.compile(
    r"^(?:(?P<pci>[0-9a-fA-F:.]+)\s+)?(?P<dev>\S+)\s+(?:\(.*?\)\s+.*?)?port\s+(?P<port>\d+)"
    r"(?:\s+\(\s*(?P<state>[A-Z_]+)\s*\))?\s+==>\s+(?P<netdev>\S+)\s+\((?P<link>[^)]*)\)"
)


def parse_ibdev2netdev(text: str, *, taken_at: datetime | None = None) -> FabricReading:
    by_dev: dict[str, tuple[list[FabricPort], list[NetDev], str | None]] = {}
    problems: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _I2N.match(line.strip())
        if m is None:
            problems.append(f"ibdev2netdev: cannot read {line.strip()[:120]!r}")
            continue
        netdev, link = m.group("netdev"), m.group("link").strip().lower()
        ports, netdevs, _ = by_dev.setdefault(m.group("dev"), ([], [], m.group("pci")))
        ipoib = netdev.startswith("ib")
        ports.append(
            FabricPort(
                number=int(m.group("port")),
                state=_state(m.group("state")),
                phys_state=None,
                rate_gbps=None,
                # An IPoIB interface means an IB port; its Up/Down is not the port's.
                link_layer="InfiniBand" if ipoib else "Ethernet",
            )
        )
        if not ipoib:
            operstate = "up" if link == "up" else "down" if link == "down" else None
            netdevs.append(
                NetDev(name=netdev, operstate=operstate, carrier=1 if link == "up" else 0)
            )
    if not by_dev and not problems:
        problems.append("ibdev2netdev: no 'port N ==> netdev' lines")
    adapters = [
        _adapter(dev, ports, netdevs=tuple(nds), pci_address=pci)
        for dev, (ports, nds, pci) in by_dev.items()
    ]
    return _reading(adapters, problems, "ibdev2netdev", taken_at)


def fi_info_ranks(text: str) -> dict[str | None, tuple[str, ...]]:
    """Unique EFA devices per mpirun rank (None: plain `fi_info` output). `rdmap79s0-rdm`
    and `rdmap79s0-dgrm` are one device; so are its `efa` and `efa-direct` fabrics."""
    return {rank: devs for rank, (devs, _) in _fi_blocks(text).items()}


def _fi_blocks(text: str) -> dict[str | None, tuple[tuple[str, ...], int]]:
    """Per rank: the devices, and how many `provider:` blocks lack their last line
    (`protocol:`): a block cut short may carry a cut device name."""
    ranks: dict[str | None, tuple[dict[str, None], list[int]]] = {}
    for raw in text.splitlines():
        rank, line = None, raw
        rm = _RANK.match(raw)
        if rm:
            rank, line = rm.group(2), raw[rm.end() :]
        key = re.match(r"^\s*(provider|domain|protocol):\s*(\S*)", line)
        if key is None:
            continue
        devs, unclosed = ranks.setdefault(rank, ({}, [0]))
        if key.group(1) == "provider":
            unclosed[0] += 1
        elif key.group(1) == "protocol":
            unclosed[0] = max(0, unclosed[0] - 1)
        elif key.group(2):
            devs.setdefault(key.group(2).split("-", 1)[0], None)
    return {rank: (tuple(devs), unclosed[0]) for rank, (devs, unclosed) in ranks.items()}


def parse_fi_info(text: str) -> tuple[str, ...]:
    """Unique EFA devices in `fi_info -p efa` output (all ranks together)."""
    seen: dict[str, None] = {}
    for devs in fi_info_ranks(text).values():
        for d in devs:
            seen.setdefault(d, None)
    return tuple(seen)


def fi_info_reading(text: str, *, taken_at: datetime | None = None) -> list[FabricReading]:
    """One reading per node (per mpirun rank), each with only its fi_info part."""
    ranks = _fi_blocks(text)
    if not ranks:
        missing = "fi_getinfo: -61" in text or "No data available" in text
        fi = FiInfo(ran=missing, domains=(), error=None if missing else "no 'domain:' lines")
        problems = () if missing else ("fi_info: no 'provider:'/'domain:' lines",)
        return [
            FabricReading(
                taken_at=taken_at or utcnow(),
                adapters=(),
                problems=problems,
                fi_info=fi,
                source="fi_info",
            )
        ]
    return [
        FabricReading(
            taken_at=taken_at or utcnow(),
            adapters=(),
            fi_info=FiInfo(ran=True, domains=devs),
            problems=("fi_info: the output is cut short (a block without its protocol:)",)
            if unclosed
            else (),
            source="fi_info" if rank is None else f"fi_info (mpirun rank {rank})",
        )
        for rank, (devs, unclosed) in sorted(ranks.items(), key=lambda kv: int(kv[0] or 0))
    ]


def _missing(attrs: dict[str, str], keys: tuple[str, ...], where: str) -> tuple[str, ...]:
    gone = [k for k in keys if not attrs.get(k)]
    return (f"{where}: no {', '.join(gone)} in the output",) if gone else ()
