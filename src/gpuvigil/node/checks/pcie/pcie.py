"""Probe + check `pcie`: current vs maximum PCIe link speed and width, from sysfs.

Reads NVIDIA GPUs (vendor 0x10de, class display/3D) from `<root>/sys/bus/pci/devices` and
the PCI functions behind every RDMA adapter in `<root>/sys/class/infiniband` into a
PcieReading, which the pipeline's `pcie` rule judges. Which PCI functions are GPUs and
which are adapters (their vendor/class files, their resolved device links) is resolved
once and kept while the folder listings stay the same: each run then reads only the
link files, a few opens instead of two per PCI function on the bus. Called by the check
registry and by the `gpu` check (how many GPUs the bus holds).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuvigil.core.findings import utcnow
from gpuvigil.node.checks import CheckContext, Needs, Readout, check
from gpuvigil.node.checks.pcie.readings import PcieLink, PcieReading

PCI_DEVICES = "sys/bus/pci/devices"
IB_CLASS = "sys/class/infiniband"
NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


def parse_speed(text: str | None) -> tuple[float | None, bool]:
    """'32.0 GT/s PCIe' -> (32.0, True); 'Unknown' -> (None, True); garbage -> (None, False)."""
    if text is None:
        return None, False
    m = _SPEED.match(text)
    if m:
        return float(m.group(1)), True
    return None, text.strip().lower() == "unknown"


def parse_width(text: str | None) -> int | None:
    t = (text or "").strip()
    return int(t) if re.fullmatch(r"[0-9]{1,6}", t) else None


def _read(path: Path | str, problems: list[str]) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError as e:
        problems.append(f"{path}: unreadable ({e.strerror or e})")
        return None
    return data.decode("utf-8", errors="replace").strip()


def read_link(dev: Path, *, role: str, name: str) -> PcieLink:
    problems: list[str] = []
    values = {}
    for f in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width"):
        values[f] = _read(f"{dev}/{f}", problems)
    speed, ok_s = parse_speed(values["current_link_speed"])
    max_speed, ok_m = parse_speed(values["max_link_speed"])
    width, max_width = (
        parse_width(values["current_link_width"]),
        parse_width(values["max_link_width"]),
    )
    for f, ok in (
        ("current_link_speed", ok_s),
        ("max_link_speed", ok_m),
        ("current_link_width", width is not None),
        ("max_link_width", max_width is not None),
    ):
        if values[f] is not None and not ok:
            problems.append(f"{dev / f}: cannot parse {values[f][:40]!r}")
    return PcieLink(
        address=dev.name,
        role=role,
        name=name,
        speed_gts=speed,
        max_speed_gts=max_speed,
        width=width,
        max_width=max_width,
        problems=tuple(problems),
    )


@dataclass(frozen=True)
class _Layout:
    """Which PCI functions to read, resolved from one pair of folder listings."""

    pci_listing: tuple[str, ...]
    ib_listing: tuple[str, ...]
    gpus: tuple[str, ...]  # PCI addresses of NVIDIA GPUs, in bus order
    nics: tuple[tuple[str, Path], ...]  # (adapter name, its PCI function's folder)


_layouts: dict[Path, _Layout] = {}
_layouts_lock = threading.Lock()


def _listing(path: Path) -> tuple[str, ...] | OSError:
    try:
        return tuple(sorted(os.listdir(path)))
    except OSError as e:
        return e


def _layout(root: Path) -> _Layout | OSError:
    """The resolved layout below `root`; resolved again only when a listing changed."""
    pci_names = _listing(Path(root) / PCI_DEVICES)
    if isinstance(pci_names, OSError):
        return pci_names
    ib_names = _listing(Path(root) / IB_CLASS)
    ib_names = () if isinstance(ib_names, OSError) else ib_names
    with _layouts_lock:
        cached = _layouts.get(Path(root))
    if cached is not None and (cached.pci_listing, cached.ib_listing) == (pci_names, ib_names):
        return cached
    pci = Path(root) / PCI_DEVICES
    gpus = []
    for addr in pci_names:
        vendor = _read(pci / addr / "vendor", [])
        pci_class = _read(pci / addr / "class", [])
        # NVML and CUDA (PCI_BUS_ID order) number GPUs by PCI address, as we do here.
        if vendor == NVIDIA and (pci_class or "").startswith(GPU_CLASSES):
            gpus.append(addr)
    nics, seen = [], set()
    for name in ib_names:
        dev = Path(os.path.realpath(Path(root) / IB_CLASS / name / "device"))
        if dev.is_dir() and dev.name not in seen:
            seen.add(dev.name)
            nics.append((name, dev))
    layout = _Layout(pci_names, ib_names, tuple(gpus), tuple(nics))
    with _layouts_lock:
        _layouts[Path(root)] = layout
    return layout


def gpu_addresses(root: Path) -> tuple[str, ...]:
    """PCI addresses of the NVIDIA GPUs on the bus below `root` (none if unreadable)."""
    layout = _layout(root)
    return () if isinstance(layout, OSError) else layout.gpus


def read_pcie(root: Path) -> PcieReading:
    taken_at = utcnow()
    pci = Path(root) / PCI_DEVICES
    layout = _layout(root)
    if isinstance(layout, OSError):
        why = layout.strerror or layout
        return PcieReading(taken_at=taken_at, links=(), problems=(f"{pci}: unreadable ({why})",))
    links = [
        read_link(pci / addr, role="gpu", name=f"gpu:{i}") for i, addr in enumerate(layout.gpus)
    ]
    links += [read_link(dev, role="nic", name=f"nic:{name}") for name, dev in layout.nics]
    if any(link.problems for link in links):
        with _layouts_lock:  # a function gone or changed: resolve afresh next time
            _layouts.pop(Path(root), None)
    return PcieReading(taken_at=taken_at, links=tuple(links))


@check("pcie", group="fast", interval_s=60.0, timeout_s=20.0, needs=Needs(paths=(PCI_DEVICES,)))
def pcie_check(ctx: CheckContext) -> Readout:
    """PCIe links of GPUs and network adapters: current vs maximum speed and width."""
    return Readout((read_pcie(ctx.root),))
