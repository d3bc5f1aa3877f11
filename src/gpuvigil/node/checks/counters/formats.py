"""What `gpuvigil analyze` reads with the `counters` domain: NVLink counters (`nvidia-smi
nvlink -e`, `dcgmi nvlink -e [-j] / -s`) and NIC counters (`perfquery`, `ethtool -S`)."""

from __future__ import annotations

import re

from gpuvigil.node.checks.counters import nic_counters, nvlink_counters
from gpuvigil.node.checks.nvlink import nvidia_smi_nvlink


def is_nvlink_counters(text: str, lines: list[str]) -> bool:
    """Before the other marks: `nvlink -e` carries the `nvlink -s` GPU lines, and
    `dcgmi nvlink -e -j` the JSON framing of `dcgmi health -j`."""
    return nvlink_counters.looks_like(text) or _dcgmi_nvlink_json(text)


def _dcgmi_nvlink_json(text: str) -> bool:
    return text.lstrip().startswith("{") and re.search(r'"NVLINK Error Counts"', text) is not None


def is_perfquery(text: str, lines: list[str]) -> bool:
    return nic_counters.looks_like(text) == "perfquery"


def is_ethtool(text: str, lines: list[str]) -> bool:
    return nic_counters.looks_like(text) not in (None, "perfquery")


def read_nvlink_counters(text: str) -> list[object]:
    out: list[object] = [nvlink_counters.parse(text)]
    if re.search(r"^\s+Link \d+: \S+ [GM]B/s", text, re.M):  # `-s` pasted with `-e`
        out.append(nvidia_smi_nvlink.parse_nvlink_status(text))
    return out


def read_nic_counters(text: str) -> list[object]:
    return [nic_counters.parse(text)]
