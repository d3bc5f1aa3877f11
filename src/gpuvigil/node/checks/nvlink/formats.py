"""What `gpuvigil analyze` reads with the `nvlink` domain: `nvidia-smi nvlink -s`."""

from __future__ import annotations

import re

from gpuvigil.node.checks.nvlink.nvidia_smi_nvlink import parse_nvlink_status

# The UUID may be elided in a paste (`(UUID: ...)`); a GPU line then needs a link line after.
_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: GPU-[0-9a-fA-F-]+\)\s*$", re.MULTILINE)
_ELIDED = re.compile(r"^GPU \d+: .*\(UUID: [^)]*\)\s*\n\s+Link \d+: ", re.MULTILINE)


def is_status(text: str, lines: list[str]) -> bool:
    return _GPU_LINE.search(text) is not None or _ELIDED.search(text) is not None


def read_status(text: str) -> list[object]:
    return [parse_nvlink_status(text)]
