"""The few types every layer shares. Imports nothing else of gpuvigil's.

The names below load on first use (PEP 562), so that importing one light module of
`gpuvigil.core` (the verdict enums, the exit-code table) does not build the pydantic
report models: a command's start-up pays only for what it touches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuvigil.core.conditions import Condition
    from gpuvigil.core.findings import CheckRun, Finding, NodeReport, utcnow
    from gpuvigil.core.verdicts import Action, Status

_WHERE = {
    "Action": "gpuvigil.core.verdicts",
    "Status": "gpuvigil.core.verdicts",
    "CheckRun": "gpuvigil.core.findings",
    "Finding": "gpuvigil.core.findings",
    "NodeReport": "gpuvigil.core.findings",
    "utcnow": "gpuvigil.core.findings",
    "Condition": "gpuvigil.core.conditions",
}

__all__ = ["Action", "CheckRun", "Condition", "Finding", "NodeReport", "Status", "utcnow"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'gpuvigil.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value
