"""Probe + check `pcie`: current vs maximum PCIe link speed and width, from sysfs.

Reads NVIDIA GPUs (vendor 0x10de, class display/3D) from `<root>/sys/bus/pci/devices` and
the PCI functions behind every RDMA adapter in `<root>/sys/class/infiniband`, then hands
the PcieReading to `node/rules/pcie.py`. Called by the check registry.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuvigil.core.findings import Finding, utcnow
from gpuvigil.node.checks import CheckContext, Needs, check
from gpuvigil.node.readings import PcieLink, PcieReading
from gpuvigil.node.rules import pcie as rules

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


def _read(path: Path, problems: list[str]) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as e:
        problems.append(f"{path}: unreadable ({e.strerror or e})")
        return None


def read_link(dev: Path, *, role: str, name: str) -> PcieLink:
    problems: list[str] = []
    values = {}
    for f in ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width"):
        values[f] = _read(dev / f, problems)
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


def read_pcie(root: Path) -> PcieReading:
    taken_at = utcnow()
    problems: list[str] = []
    links: list[PcieLink] = []
    pci = Path(root) / PCI_DEVICES
    try:
        addresses = sorted(os.listdir(pci))
    except OSError as e:
        return PcieReading(
            taken_at=taken_at, links=(), problems=(f"{pci}: unreadable ({e.strerror or e})",)
        )
    gpu_index = 0
    for addr in addresses:
        dev = pci / addr
        vendor = _read(dev / "vendor", [])
        pci_class = _read(dev / "class", [])
        if vendor != NVIDIA or not (pci_class or "").startswith(GPU_CLASSES):
            continue
        # NVML and CUDA (PCI_BUS_ID order) number GPUs by PCI address, as we do here.
        links.append(read_link(dev, role="gpu", name=f"gpu:{gpu_index}"))
        gpu_index += 1
    ib = Path(root) / IB_CLASS
    try:
        adapters = sorted(os.listdir(ib))
    except OSError:
        adapters = []
    seen: set[str] = set()
    for name in adapters:
        dev = Path(os.path.realpath(ib / name / "device"))
        if not dev.is_dir() or dev.name in seen:
            continue
        seen.add(dev.name)
        links.append(read_link(dev, role="nic", name=f"nic:{name}"))
    return PcieReading(taken_at=taken_at, links=tuple(links), problems=tuple(problems))


@check("pcie", group="fast", interval_s=60.0, timeout_s=20.0, needs=Needs(paths=(PCI_DEVICES,)))
def pcie_check(ctx: CheckContext) -> list[Finding]:
    """PCIe links of GPUs and network adapters: current vs maximum speed and width."""
    judge_gpu_speed = bool(getattr(ctx.config.fabric, "pcie_judge_gpu_speed", False))
    return rules.judge(read_pcie(ctx.root), judge_gpu_speed=judge_gpu_speed)
