"""How `gpuvigil analyze` tells a kernel log (it streams it itself: `capture.session`)."""

from __future__ import annotations

from gpuvigil.node.checks.kernel_log.kernel_log_shape import looks_like_kernel_line


def is_kernel_log(text: str, lines: list[str]) -> bool:
    """Most of the first lines look like kernel-log lines, or an NVIDIA driver line is
    there (a grep of a kernel log)."""
    sample = lines[:50]
    if not sample:
        return False
    if any("NVRM:" in ln or "Xid (" in ln for ln in lines[:2000]):
        return True
    kernelish = sum(1 for ln in sample if looks_like_kernel_line(ln))
    return kernelish * 2 >= len(sample)
