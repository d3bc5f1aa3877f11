"""Node checks: the one registry of checks (`registry`), and one folder per health domain
(`gpu/`, `kernel_log/`, `fabric/`, ...) holding that domain's spec, probes, readings and rules
(`domain.load_domains` finds them; docs/architecture.md, "How to add a check").

`from gpuvigil.node.checks import check, CheckContext, REGISTRY, ...` names the registry's
objects. They load on first use (PEP 562), not with the package: importing a domain's pure
parser (`gpuvigil logscan` imports `kernel_log.kernel_log_parser`, and its start-up is most
of its cost) must not load the registry and what it imports (findings, the catalog, the
pipeline).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuvigil.node.checks.registry import (
        REGISTRY,
        CheckContext,
        CheckFn,
        CheckSpec,
        Needs,
        Readout,
        call,
        check,
        missing_needs,
        run_check,
        timed_out,
    )

__all__ = [
    "REGISTRY",
    "CheckContext",
    "CheckFn",
    "CheckSpec",
    "Needs",
    "Readout",
    "call",
    "check",
    "missing_needs",
    "run_check",
    "timed_out",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("gpuvigil.node.checks.registry"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
