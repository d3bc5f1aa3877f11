"""What `gpuvigil analyze` reads with the `topology` domain: `nvidia-smi topo -m`."""

from __future__ import annotations

from gpuvigil.node.checks.topology import topology


def is_topo(text: str, lines: list[str]) -> bool:
    return topology.header_of(lines) is not None


def read_topo(text: str) -> list[object]:
    return [topology.parse(text)]
