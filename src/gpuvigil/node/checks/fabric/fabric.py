"""Probe + check `fabric`: EFA / InfiniBand / RoCE adapters from sysfs, and `fi_info -p efa`.

Reads `<root>/sys/class/infiniband/*` into a FabricReading (unreadable or garbled files
become `problems`, never exceptions) and runs `fi_info` through the fail-closed runner
when the node has or expects EFA. The reading and the node's instance type go to the
node's facts and the pipeline's `fabric` rule, which judges error counters as rates
against the previous reading. Called by the check registry (`gpuvigil check`, the agent,
preflight) and `gpuvigil analyze --sysfs`.

What does not change between runs (which adapters, their ports and counter files, their
PCI function, driver and network interfaces: symlinks, globs and listings) is resolved
once per listing of `class/infiniband` and kept (`_Layout`); a run then opens only the
files whose values change. A file that vanished drops the layout, so the next run
resolves it afresh (a driver reload, a hot-plugged adapter).
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuvigil.core.findings import Finding, utcnow
from gpuvigil.io import exec as execp
from gpuvigil.node import instance
from gpuvigil.node.checks import CheckContext, Readout, check
from gpuvigil.node.checks.fabric.fabric_tools import parse_fi_info
from gpuvigil.node.checks.fabric.readings import (
    FabricAdapter,
    FabricPort,
    FabricReading,
    FiInfo,
    NetDev,
)
from gpuvigil.node.config import FabricConfig

CHECK = "fabric"
IB_CLASS = "sys/class/infiniband"
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*(?:\d+\s*:\s*)?([A-Za-z_]+)\s*$")
_SKIP_COUNTERS = {"lifespan"}  # a refresh interval, not a counter
MAX_FILE = 4096


def _read(path: Path | str, problems: list[str]) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        problems.append(f"{path}: missing")
        return None
    except OSError as e:
        problems.append(f"{path}: unreadable ({e.strerror or e})")
        return None
    try:
        data = os.read(fd, MAX_FILE)
    except OSError as e:
        problems.append(f"{path}: unreadable ({e.strerror or e})")
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


def parse_state(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'; garbage -> None."""
    m = _STATE.match(text or "")
    return m.group(1) if m else None


def parse_rate(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0; garbage -> None."""
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def _counter_files(port_dir: Path | str) -> tuple[tuple[str, str], ...]:
    """(name, path) of every error counter of a port: counters/ then hw_counters/."""
    out = []
    for sub in ("counters", "hw_counters"):
        d = f"{port_dir}/{sub}"
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        out += [(n, f"{d}/{n}") for n in names if n not in _SKIP_COUNTERS]
    return tuple(out)


def _read_port(
    port_dir: Path | str, counter_files: tuple[tuple[str, str], ...] | None = None
) -> FabricPort:
    problems: list[str] = []
    state_text = _read(f"{port_dir}/state", problems)
    phys_text = _read(f"{port_dir}/phys_state", problems)
    rate_text = _read(f"{port_dir}/rate", problems)
    link_layer = _read(f"{port_dir}/link_layer", [])  # optional (absent on old kernels)
    state, phys, rate = parse_state(state_text), parse_state(phys_text), parse_rate(rate_text)
    for name, raw, value in (
        ("state", state_text, state),
        ("phys_state", phys_text, phys),
        ("rate", rate_text, rate),
    ):
        if raw is not None and value is None:
            problems.append(f"{port_dir}/{name}: cannot parse {raw[:60]!r}")
    counters: dict[str, int] = {}
    files = _counter_files(port_dir) if counter_files is None else counter_files
    for name, path in files:
        raw = _read(path, problems)
        if raw is None:
            continue
        try:
            counters[name] = int(raw, 0)
        except ValueError:
            problems.append(f"{path}: not a number: {raw[:40]!r}")
    base = os.path.basename(str(port_dir))
    try:
        number = int(base)
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


def _read_netdevs(
    dev_dir: Path, problems: list[str], dirs: tuple[str, ...] | None = None
) -> tuple[NetDev, ...]:
    out = []
    for nd in [str(d) for d in _netdev_dirs(dev_dir)] if dirs is None else dirs:
        operstate = _read(f"{nd}/operstate", problems)
        carrier_raw = _read(f"{nd}/carrier", [])  # EINVAL while the interface is down
        carrier = int(carrier_raw) if carrier_raw in ("0", "1") else None
        out.append(NetDev(name=os.path.basename(nd), operstate=operstate, carrier=carrier))
    return tuple(out)


def _driver(dev_dir: Path) -> str:
    return os.path.basename(os.path.realpath(dev_dir / "device" / "driver"))


def _kind(name: str, driver: str, hca_type: str | None, ports: tuple[FabricPort, ...]) -> str:
    if driver == "efa" or name.startswith(("rdmap", "efa")) or (hca_type or "") == "efa":
        return "efa"
    layers = {p.link_layer for p in ports}
    return "roce" if layers == {"Ethernet"} else "ib"


@dataclass(frozen=True)
class _AdapterLayout:
    """What does not change while an adapter stays: resolved once (see module docstring)."""

    dir: Path
    hca_type: str | None
    pci: str | None
    driver: str
    ports: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (port dir, counter files)
    netdev_dirs: tuple[str, ...]
    problems: tuple[str, ...]  # found while resolving (a ports/ folder that cannot be read)


def _resolve(dev_dir: Path) -> _AdapterLayout:
    problems: list[str] = []
    ports_dir = dev_dir / "ports"
    try:
        port_names = sorted(os.listdir(ports_dir), key=lambda s: (len(s), s))
    except OSError as e:
        problems.append(f"{ports_dir}: unreadable ({e.strerror or e})")
        port_names = []
    pci = (
        os.path.basename(os.path.realpath(dev_dir / "device"))
        if (dev_dir / "device").exists()
        else None
    )
    return _AdapterLayout(
        dir=dev_dir,
        hca_type=_read(dev_dir / "hca_type", []),
        pci=pci,
        driver=_driver(dev_dir),
        ports=tuple((f"{ports_dir}/{n}", _counter_files(f"{ports_dir}/{n}")) for n in port_names),
        netdev_dirs=tuple(str(d) for d in _netdev_dirs(dev_dir)),
        problems=tuple(problems),
    )


def _read_resolved(layout: _AdapterLayout) -> FabricAdapter:
    problems = list(layout.problems)
    ports = tuple(_read_port(d, files) for d, files in layout.ports)
    netdevs = _read_netdevs(layout.dir, problems, layout.netdev_dirs)
    return FabricAdapter(
        name=layout.dir.name,
        kind=_kind(layout.dir.name, layout.driver, layout.hca_type, ports),
        ports=ports,
        pci_address=layout.pci,
        hca_type=layout.hca_type,
        netdevs=netdevs,
        problems=tuple(problems),
    )


def read_adapter(dev_dir: Path) -> FabricAdapter:
    return _read_resolved(_resolve(dev_dir))


_layouts: dict[Path, tuple[tuple[str, ...], tuple[_AdapterLayout, ...]]] = {}
_layouts_lock = threading.Lock()


def read_fabric(root: Path, *, fi_info: FiInfo | None = None) -> FabricReading:
    """Everything under `<root>/sys/class/infiniband`, never raising."""
    taken_at = utcnow()
    ib = Path(root) / IB_CLASS
    try:
        names = tuple(sorted(os.listdir(ib)))
    except FileNotFoundError:
        return FabricReading(taken_at=taken_at, adapters=(), sysfs_present=False, fi_info=fi_info)
    except OSError as e:
        if not ib.is_dir():
            return FabricReading(
                taken_at=taken_at, adapters=(), sysfs_present=False, fi_info=fi_info
            )
        return FabricReading(
            taken_at=taken_at,
            adapters=(),
            problems=(f"{ib}: unreadable ({e.strerror or e})",),
            fi_info=fi_info,
        )
    with _layouts_lock:
        cached = _layouts.get(ib)
    if cached is None or cached[0] != names:
        cached = (names, tuple(_resolve(ib / n) for n in names))
    adapters = tuple(_read_resolved(a) for a in cached[1])
    vanished = any(
        p.endswith(": missing") for a in adapters for p in (*a.problems, *_port_problems(a))
    )
    with _layouts_lock:  # a file gone (driver reload, adapter pulled): resolve afresh
        if vanished:
            _layouts.pop(ib, None)
        else:
            _layouts[ib] = cached
    return FabricReading(taken_at=taken_at, adapters=adapters, fi_info=fi_info)


def _port_problems(a: FabricAdapter) -> list[str]:
    return [p for port in a.ports for p in port.problems]


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
    failure = execp.failure_finding(result, check=CHECK, what="fi_info")
    if failure is not None:
        return FiInfo(ran=False, error=result.error or f"exit {result.returncode}"), failure
    domains = parse_fi_info(result.text)
    if not domains:
        return FiInfo(ran=False, error="no domains"), execp.unparsable_finding(
            result, check=CHECK, problem="exit 0 but no 'domain:' lines"
        )
    return FiInfo(ran=True, domains=domains), None


@check("fabric", group="fast", interval_s=30.0, timeout_s=30.0)
def fabric_check(ctx: CheckContext) -> Readout:
    """RDMA adapters (EFA/InfiniBand/RoCE): count, port state, rate, error-counter rates."""
    cfg: FabricConfig = ctx.config.fabric
    node = instance.node_instance(ctx)
    reading = read_fabric(ctx.root)
    findings: list[Finding] = []
    spec = node.entry[1].fabric if node.entry else None
    expects_efa = (cfg.kind or (spec.kind if spec else None)) == "efa"
    if expects_efa or any(a.kind == "efa" for a in reading.adapters):
        fi, failure = run_fi_info(ctx, cfg)
        reading = dataclasses.replace(reading, fi_info=fi)
        if failure is not None:
            findings.append(failure)
    return Readout((reading, node), tuple(findings))
