"""What `gpuvigil analyze` reads with the `dcgm` domain: `dcgmi diag`, `dcgmi health` and
`dcgmi discovery -l`, JSON or table, and fragments of the diag table."""

from __future__ import annotations

import re

from gpuvigil.node.checks.dcgm.dcgm_discovery import parse_discovery
from gpuvigil.node.checks.dcgm.dcgm_health_parse import parse_health
from gpuvigil.node.checks.dcgm.dcgm_parse import parse_diag

_M = re.MULTILINE
# DCGM 4.x says which GPUs it counted: "1 GPU found (Active)."
_DISCOVERY = re.compile(r"^\s*\d+ GPUs? found(?: \([^)]*\))?\.\s*$", _M)
_DIAG = re.compile(
    r"Successfully ran diagnostic for group|^\|\s*Diagnostic\s*\|\s*Result\s*\||"
    r'"DCGM (?:GPU )?Diagnostic"',
    _M,
)
# Only the report's own words: `dcgmi topo -j`, `nvlink -e -j`... share its JSON framing.
_HEALTH = re.compile(r"Health Monitor Report|Overall Health", re.I)
# A row or a section rule of the `dcgmi diag` table (DCGM 2.x-4.x test names), for pasted
# fragments that lack the `| Diagnostic | Result |` header.
_DIAG_ROW = re.compile(
    r"^\|\s*(?:GPU Memory|Memtest|Memory Bandwidth|Diagnostic|PCIe|SM Stress|Targeted Stress|"
    r"Targeted Power|Pulse Test|EUD|Denylist|Blacklist|NVML Library|CUDA Main Library|"
    r"Permissions and OS Blocks|Persistence Mode|Environment Variables|Page Retirement/Row Remap|"
    r"Graphics Processes|Inforom|Fabric Manager|software|memory|pcie|diagnostic|targeted_stress|"
    r"targeted_power|memory_bandwidth|memtest|pulse_test|nvbandwidth)\s*\|\s*"
    r"(?:Pass|Fail|Skip|Warn|Not Run)\b",
    re.I,
)
_DIAG_SECTION = re.compile(
    r"^[+|]-{3,}\s+(?:Metadata|Deployment|Integration|Hardware|Stress)\s+-+[+|]"
)


def is_discovery(text: str, lines: list[str]) -> bool:
    return _DISCOVERY.search(text) is not None


def is_diag(text: str, lines: list[str]) -> bool:
    return _DIAG.search(text) is not None


def is_health(text: str, lines: list[str]) -> bool:
    return _HEALTH.search(text) is not None


def is_diag_fragment(text: str, lines: list[str]) -> bool:
    """A fragment of the diag table, without its header."""
    return any(_DIAG_ROW.match(ln) or _DIAG_SECTION.match(ln) for ln in lines[:400])


def read_diag(text: str) -> list[object]:
    return [parse_diag(text)]


def read_health(text: str) -> list[object]:
    return [parse_health(text)]


def read_discovery(text: str) -> list[object]:
    return [parse_discovery(text)]
