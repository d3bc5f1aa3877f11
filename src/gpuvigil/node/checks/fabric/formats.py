"""What `gpuvigil analyze` reads with the `fabric` domain: the InfiniBand and EFA tools'
outputs (a captured sysfs tree is a folder: `capture.session` runs the checks over it)."""

from __future__ import annotations

import re

from gpuvigil.node.checks.fabric import fabric_tools, rdma_link

_M = re.MULTILINE
_IBSTAT = re.compile(r"^CA '[^']+'\s*$", _M)
# An ibstat excerpt without its `CA '...'` line: a port block in ibstat's own words.
_IBSTAT_PORT = re.compile(r"^\s*Port \d+:\s*\n\s+State:\s*\w+\s*\n\s+Physical state:", _M)
_IBSTATUS = re.compile(r"^Infiniband device '[^']+' port \d+ status:", _M)
_IBV_DEVINFO = re.compile(r"^hca_id:\s*\S+", _M)
# `| column -t` widens the gaps; `-v` pads the state: "port 1 (DOWN  ) ==> ib2 (Down)".
_IBDEV2NETDEV = re.compile(
    r"^(?:\S+\s+)?\S+\s+.*?port\s+\d+(?:\s+\(\s*[A-Z_]+\s*\))?\s+==>\s+\S+\s+\(", _M
)
_FI_INFO = re.compile(r"^(?:\s*\[\d+,\d+\]<std\w+>:)?\s*provider:\s*\S+\s*$", _M)


def is_ibstat(text: str, lines: list[str]) -> bool:
    return _IBSTAT.search(text) is not None or _IBSTAT_PORT.search(text) is not None


def is_ibstatus(text: str, lines: list[str]) -> bool:
    return _IBSTATUS.search(text) is not None


def is_ibv_devinfo(text: str, lines: list[str]) -> bool:
    return _IBV_DEVINFO.search(text) is not None


def is_ibdev2netdev(text: str, lines: list[str]) -> bool:
    return _IBDEV2NETDEV.search(text) is not None


def is_fi_info(text: str, lines: list[str]) -> bool:
    return _FI_INFO.search(text) is not None


def is_rdma_link(text: str, lines: list[str]) -> bool:
    return rdma_link.looks_like(lines)


def read_ibstat(text: str) -> list[object]:
    return [fabric_tools.parse_ibstat(text)]


def read_ibstatus(text: str) -> list[object]:
    return [fabric_tools.parse_ibstatus(text)]


def read_ibv_devinfo(text: str) -> list[object]:
    return [fabric_tools.parse_ibv_devinfo(text)]


def read_ibdev2netdev(text: str) -> list[object]:
    return [fabric_tools.parse_ibdev2netdev(text)]


def read_fi_info(text: str) -> list[object]:
    """fi_info behind mpirun is one reading per rank."""
    return list(fabric_tools.fi_info_reading(text))


def read_rdma_link(text: str) -> list[object]:
    return [rdma_link.parse(text)]
