"""PCI bus ids in one form (`normalize_bus_id`), apart from `readings` (26 dataclasses,
0.026 s to import) so that `logscan`'s parser starts without them."""

from __future__ import annotations

import functools
import re

_BUS_ID = re.compile(
    r"^\s*(?:PCI:)?(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?\s*$"
)


@functools.lru_cache(maxsize=4096)  # a node has a few dozen bus ids; logs repeat them
def normalize_bus_id(text: str) -> str | None:
    """`PCI:0000:3b:00`, `00000000:3B:00.0`, `3b:00` -> `0000:3b:00.0`; None if not a bus id.

    The kernel log prints a 4-digit domain without the function; NVML prints an 8-digit
    upper-case domain with it. GPUs are function 0, so a missing function means 0.
    """
    m = _BUS_ID.match(text)
    if m is None:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn or '0'}"
