"""What `gpuvigil analyze` reads with the `nvlink` domain: `nvidia-smi nvlink -s`."""

from __future__ import annotations

import re

from gpuvigil.node.checks.nvlink.nvidia_smi_nvlink import parse_nvlink_status

_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: GPU-[0-9a-fA-F-]+\)\s*$", re.MULTILINE)


def is_status(text: str, lines: list[str]) -> bool:
    return _GPU_LINE.search(text) is not None


def read_status(text: str) -> list[object]:
    return [parse_nvlink_status(text)]
