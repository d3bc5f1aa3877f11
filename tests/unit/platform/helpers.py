"""Findings and nodes for the controller's unit tests."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary, HealthSummary
from gpuvigil.platform.state import NodeView, Record

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def finding(
    code: str = "XID_79",
    *,
    action: Action = Action.RESET_GPU,
    fatal: bool = False,
    status: Status = Status.FAILED,
    component: str = "gpu:3",
    check: str = "xid",
) -> FindingSummary:
    return FindingSummary(
        code=code, component=component, status=status, action=action, fatal=fatal, check=check
    )


FATAL = finding(fatal=True)
NONFATAL = finding("NVLINK_ERRORS", action=Action.RESET_GPU)
INVESTIGATE = finding("GPU_SDC", action=Action.INVESTIGATE)
CANNOT_RUN = finding("DEPENDENCY_MISSING", action=Action.NONE, component="node", check="nvml")
REPLACE = finding("ROW_REMAP_FAILURE", action=Action.REPLACE, fatal=True)


def view(
    *findings: FindingSummary,
    record: Record | None = None,
    at: datetime = T0,
    name: str = "n1",
    **kw: object,
) -> NodeView:
    status = Status.worst(f.status for f in findings)
    health = HealthSummary(generated_at=at, status=status, findings=list(findings))
    fields: dict[str, object] = {
        "name": name,
        "health": health,
        "health_error": None,
        "heartbeat_at": at,
        "record": record,
        "blocked_by_us": record is not None and record.state.blocks,
    }
    fields.update(kw)
    return NodeView(**fields)  # type: ignore[arg-type]
