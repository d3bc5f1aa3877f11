"""Findings -> node conditions, after node-problem-detector's convention.

One condition type per problem family; `status=True` means the problem is present;
`reason` is the code of the worst finding; `message` is for people.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from gpuvigil.core import codes

if TYPE_CHECKING:
    from gpuvigil.core.findings import Finding

MESSAGE_LIMIT = 1024  # Kubernetes accepts far more, but people read these in `kubectl describe`.


class Condition(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    status: bool
    reason: str
    message: str


def derive_conditions(findings: Iterable[Finding]) -> list[Condition]:
    """Every family gets a condition, present or not, so a cleared problem is published."""
    by_family: dict[str, list[Finding]] = {f: [] for f in codes.FAMILIES}
    for f in findings:
        if f.status.value == "FAILED":
            by_family.setdefault(f.family, []).append(f)
    out = []
    for family, failed in by_family.items():
        if not failed:
            out.append(Condition(type=family, status=False, reason=f"No{family}", message=""))
            continue
        failed.sort(key=lambda f: (-f.action.rank, not f.fatal, f.code, f.component))
        parts = [f"{f.component} {f.code}: {f.message}".strip() for f in failed]
        msg = "; ".join(parts)
        if len(msg) > MESSAGE_LIMIT:
            msg = msg[: MESSAGE_LIMIT - 1] + "…"
        out.append(Condition(type=family, status=True, reason=failed[0].code, message=msg))
    return out
