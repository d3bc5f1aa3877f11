"""Probe + check `fabric`: EFA / InfiniBand / RoCE adapters from sysfs, and `fi_info -p efa`.

Reads `<root>/sys/class/infiniband/*` into a FabricReading (unreadable or garbled files
become `problems`, never exceptions), runs `fi_info` through the fail-closed runner when
the node has or expects EFA, and hands both to the pure rules in `node/rules/fabric.py`.
The previous reading is kept in `ctx.extras` so error counters are judged as rates.
Called by the check registry (`gpuvigil check`, the agent, preflight).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuvigil.core.findings import Finding, Status, utcnow
from gpuvigil.node.checks import CheckContext, check
from gpuvigil.node.config import FabricConfig
from gpuvigil.node.probes import exec as execp
from gpuvigil.node.probes import instance
from gpuvigil.node.probes.fabric_tools import parse_fi_info
from gpuvigil.node.readings import FabricAdapter, FabricPort, FabricReading, FiInfo, NetDev
from gpuvigil.node.rules import fabric as rules

IB_CLASS = "sys/class/infiniband"
PREVIOUS_KEY = "fabric.previous"
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*(?:\d+\s*:\s*)?([A-Za-z_]+)\s*$")
_SKIP_COUNTERS = {"lifespan"}  # a refresh interval, not a counter
MAX_FILE = 4096


def _read(path: Path, problems: list[str]) -> str | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE)
    except FileNotFoundError:
        problems.append(f"{path}: missing")
        return None
    except OSError as e:
        problems.append(f"{path}: unreadable ({e.strerror or e})")
        return None
    return data.decode("utf-8", errors="replace").strip()


def parse_state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'; garbage -> None."""
    m = _STATE.match(text or "")
    return m.group(1) if m else None


def parse_rate(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0; garbage -> None."""
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def _read_port(port_dir: Path) -> FabricPort:
    problems: list[str] = []
    state_text = _read(port_dir / "state", problems)
    phys_text = _read(port_dir / "phys_state", problems)
    rate_text = _read(port_dir / "rate", problems)
    link_layer = _read(port_dir / "link_layer", [])  # optional (absent on old kernels)
    state, phys, rate = parse_state(state_text), parse_state(phys_text), parse_rate(rate_text)
    for name, raw, value in (
        ("state", state_text, state),
        ("phys_state", phys_text, phys),
        ("rate", rate_text, rate),
    ):
        if raw is not None and value is None:
            problems.append(f"{port_dir / name}: cannot parse {raw[:60]!r}")
    counters: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        d = port_dir / sub
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if name in _SKIP_COUNTERS:
                continue
            raw = _read(d / name, problems)
            if raw is None:
                continue
            try:
                counters[name] = int(raw, 0)
            except ValueError:
                problems.append(f"{d / name}: not a number: {raw[:40]!r}")
    try:
        number = int(port_dir.name)
    except ValueError:
        number = 0
        problems.append(f"{port_dir}: port folder is not a number")
    return FabricPort(
        number=number,
        state=state,
        phys_state=phys,
        rate_gbps=rate,
        link_layer=link_layer,
        counters=tuple(sorted(counters.items())),
        problems=tuple(problems),
    )


def _netdev_dirs(dev_dir: Path) -> list[Path]:
    """The adapter's network interfaces, first found of: the PCI function's own `net/`
    (mlx5, and EFA in gpuvigil's fake trees); the ports' GID netdevs (RoCE); the other
    functions of the same PCI slot (an adapter exposing its netdev on a sibling function)."""
    own = dev_dir / "device" / "net"
    try:
        names = sorted(os.listdir(own))
    except OSError:
        names = []
    if names:
        return [own / n for n in names]
    found: dict[str, Path] = {}
    for ndevs in sorted(dev_dir.glob("ports/*/gid_attrs/ndevs/*"))[:64]:
        try:
            name = ndevs.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if name and "/" not in name and (dev_dir.parents[1] / "net" / name).exists():
            found.setdefault(name, dev_dir.parents[1] / "net" / name)
    if found:
        return list(found.values())
    pci = Path(os.path.realpath(dev_dir / "device"))
    slot = pci.name.rsplit(".", 1)[0]
    for sibling in sorted(pci.parent.glob(f"{slot}.*")):
        if sibling == pci:
            continue
        try:
            names = sorted(os.listdir(sibling / "net"))
        except OSError:
            continue
        return [sibling / "net" / n for n in names]
    return []


def _read_netdevs(dev_dir: Path, problems: list[str]) -> tuple[NetDev, ...]:
    out = []
    for nd in _netdev_dirs(dev_dir):
        operstate = _read(nd / "operstate", problems)
        carrier_raw = _read(nd / "carrier", [])  # EINVAL while the interface is down
        carrier = int(carrier_raw) if carrier_raw in ("0", "1") else None
        out.append(NetDev(name=nd.name, operstate=operstate, carrier=carrier))
    return tuple(out)


def _kind(name: str, dev_dir: Path, hca_type: str | None, ports: tuple[FabricPort, ...]) -> str:
    driver = os.path.basename(os.path.realpath(dev_dir / "device" / "driver"))
    if driver == "efa" or name.startswith(("rdmap", "efa")) or (hca_type or "") == "efa":
        return "efa"
    layers = {p.link_layer for p in ports}
    return "roce" if layers == {"Ethernet"} else "ib"


def read_adapter(dev_dir: Path) -> FabricAdapter:
    problems: list[str] = []
    hca_type = _read(dev_dir / "hca_type", [])
    ports_dir = dev_dir / "ports"
    try:
        port_names = sorted(os.listdir(ports_dir), key=lambda s: (len(s), s))
    except OSError as e:
        problems.append(f"{ports_dir}: unreadable ({e.strerror or e})")
        port_names = []
    ports = tuple(_read_port(ports_dir / n) for n in port_names)
    pci = (
        os.path.basename(os.path.realpath(dev_dir / "device"))
        if (dev_dir / "device").exists()
        else None
    )
    netdevs = _read_netdevs(dev_dir, problems)
    return FabricAdapter(
        name=dev_dir.name,
        kind=_kind(dev_dir.name, dev_dir, hca_type, ports),
        ports=ports,
        pci_address=pci,
        hca_type=hca_type,
        netdevs=netdevs,
        problems=tuple(problems),
    )


def read_fabric(root: Path, *, fi_info: FiInfo | None = None) -> FabricReading:
    """Everything under `<root>/sys/class/infiniband`, never raising."""
    taken_at = utcnow()
    ib = Path(root) / IB_CLASS
    if not ib.is_dir():
        return FabricReading(taken_at=taken_at, adapters=(), sysfs_present=False, fi_info=fi_info)
    try:
        names = sorted(os.listdir(ib))
    except OSError as e:
        return FabricReading(
            taken_at=taken_at,
            adapters=(),
            problems=(f"{ib}: unreadable ({e.strerror or e})",),
            fi_info=fi_info,
        )
    adapters = tuple(read_adapter(ib / n) for n in names)
    return FabricReading(taken_at=taken_at, adapters=adapters, fi_info=fi_info)


def run_fi_info(ctx: CheckContext, cfg: FabricConfig) -> tuple[FiInfo, Finding | None]:
    """`fi_info -p efa -t FI_EP_RDM`. Exit 61 (`fi_getinfo: -61`) means libfabric sees no
    EFA device: a reading of zero domains, not a tool failure."""
    result = execp.run(
        ["fi_info", "-p", "efa", "-t", "FI_EP_RDM"], timeout_s=cfg.fi_info_timeout_s, env=ctx.env
    )
    if result.error == "missing" and not cfg.require_fi_info:
        return FiInfo(ran=False, error="missing"), None
    if result.error is None and result.returncode == 61:
        return FiInfo(ran=True, domains=()), None
    failure = execp.failure_finding(result, check=rules.CHECK, what="fi_info")
    if failure is not None:
        return FiInfo(ran=False, error=result.error or f"exit {result.returncode}"), failure
    domains = parse_fi_info(result.text)
    if not domains:
        return FiInfo(ran=False, error="no domains"), execp.unparsable_finding(
            result, check=rules.CHECK, problem="exit 0 but no 'domain:' lines"
        )
    return FiInfo(ran=True, domains=domains), None


@check("fabric", group="fast", interval_s=30.0, timeout_s=30.0)
def fabric_check(ctx: CheckContext) -> list[Finding]:
    """RDMA adapters (EFA/InfiniBand/RoCE): count, port state, rate, error-counter rates."""
    cfg: FabricConfig = ctx.config.fabric
    name, entry = instance.lookup(ctx)
    expected = rules.expectation(cfg, entry)
    reading = read_fabric(ctx.root)
    findings: list[Finding] = []
    configured = getattr(ctx.config, "instance_type", None)
    if configured and entry is None and cfg.expect_adapters is None:
        # Asked to judge against a type we do not know (a typo, a new type): failing
        # closed beats silently not counting. A DMI name we do not know is not an error:
        # it is any generic server's model name.
        findings.append(
            Finding(
                check=rules.CHECK,
                status=Status.FAILED,
                code="CHECK_ERROR",
                message=f"instance type {name!r} is not in the catalog: add it under "
                "node.fabric.instances or set node.fabric.expect_adapters",
                evidence={"instance_type": name},
            )
        )
    if expected.kind == "efa" or any(a.kind == "efa" for a in reading.adapters):
        fi, failure = run_fi_info(ctx, cfg)
        reading = FabricReading(
            taken_at=reading.taken_at,
            adapters=reading.adapters,
            sysfs_present=reading.sysfs_present,
            problems=reading.problems,
            fi_info=fi,
        )
        if failure is not None:
            findings.append(failure)
    previous = ctx.extras.get(PREVIOUS_KEY)
    findings += rules.judge(reading, expected=expected, config=cfg, previous=previous)
    ctx.extras[PREVIOUS_KEY] = reading
    return findings
