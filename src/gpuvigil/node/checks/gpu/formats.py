"""What `gpuvigil analyze` reads with the `gpu` domain: how each nvidia-smi output is told
from its content and read into the readings the live `gpu` check builds (`DOMAIN.formats`
names these functions; `capture.kinds` calls them)."""

from __future__ import annotations

import re

from gpuvigil.node.checks.gpu import (
    nvidia_smi,
    nvidia_smi_csv,
    nvidia_smi_errors,
    nvidia_smi_partial,
    nvidia_smi_table,
)

_XML = re.compile(r"<nvidia_smi_log\b")
_Q = re.compile(r"NVSMI LOG|^Attached GPUs\s*:", re.MULTILINE)


def is_xml(text: str, lines: list[str]) -> bool:
    return _XML.search(text) is not None


def is_q(text: str, lines: list[str]) -> bool:
    return _Q.search(text) is not None


def is_table(text: str, lines: list[str]) -> bool:
    return nvidia_smi_table.looks_like(text)


def is_q_excerpt(text: str, lines: list[str]) -> bool:
    """One section of `-q`, without its header."""
    return nvidia_smi_partial.looks_like_excerpt(lines)


def is_csv(text: str, lines: list[str]) -> bool:
    return bool(lines) and nvidia_smi_csv.looks_like_header(lines[0])


def is_error(text: str, lines: list[str]) -> bool:
    """nvidia-smi's answer when it cannot read the GPUs (a lost GPU, no driver)."""
    said = nvidia_smi_errors.scan(text)
    return bool(said.lost or said.driver or said.no_devices)


def read_xml(text: str) -> list[object]:
    """`-q -x`, and nvidia-smi's error answer (the same reader knows both)."""
    return [nvidia_smi.parse_xml(text)]


def read_q(text: str) -> list[object]:
    """Whole or partial `-q` text; its Fabric sections too."""
    first: object
    if nvidia_smi_partial.is_partial(text):
        partial = nvidia_smi_partial.parse(text)
        gpus, first = partial.inventory.gpus, partial
    else:
        inv = nvidia_smi.parse_xml(text)
        gpus, first = inv.gpus, inv
    fabric = nvidia_smi_partial.fabric_states(text, gpus)
    return [first] + ([fabric] if fabric is not None else [])


def read_csv(text: str) -> list[object]:
    return [nvidia_smi_csv.parse_csv(text)]


def read_table(text: str) -> list[object]:
    return [nvidia_smi_table.parse(text)]
