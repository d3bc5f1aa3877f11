"""The `dcgm` domain's readings: what `dcgmi health -c` and `dcgmi diag -r N` said."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DcgmResult:
    """One line of a DCGM verdict: a health watch system or a diag test, for one GPU
    (gpu None: the whole node / all GPUs)."""

    test: str  # "memory", "nvlink", "pcie" (health); "Memory", "Diagnostic" (diag)
    result: str  # "Pass" | "Fail" | "Warn" | "Skip" | "Incomplete"
    gpu: int | None = None
    info: str = ""


@dataclass(frozen=True, slots=True)
class DcgmReport:
    """What `dcgmi health -c` or `dcgmi diag -r N` said."""

    kind: str  # "health" | "diag"
    results: tuple[DcgmResult, ...] = ()
    overall: str | None = None  # "Pass" | "Fail" | "Warn" | None when not stated
    complete: bool = True  # False: the run stopped early or the output was cut
    errors: tuple[str, ...] = ()  # why the parse is incomplete
    level: int | None = None  # diag run level
