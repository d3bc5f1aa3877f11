"""What `gpuvigil analyze` reads with the `fabric_manager` domain: its journal, log file
and `systemctl status`."""

from __future__ import annotations

from gpuvigil.node.checks.fabric_manager import fabric_manager_log


def is_log(text: str, lines: list[str]) -> bool:
    return fabric_manager_log.looks_like(lines)


def read_log(text: str) -> list[object]:
    return [fabric_manager_log.parse(text)]
