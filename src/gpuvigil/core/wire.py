"""How a node's health travels from its agent to the controller, and requests back.

Kubernetes: the agent patches node conditions (one per family) and writes the compact
summary below into the node annotation `HEALTH_ANNOTATION`. Slurm: the agent writes the
same summary into the node field named by `SLURM_HEALTH_FIELD`. The controller decodes it
with `decode_health`, which never raises: garbage -> None, and the controller acts on
nothing it could not read.

Liveness. The agent rewrites its conditions' `lastHeartbeatTime` (and the summary's
`generated_at`) at least every `agent.sinks.kubernetes.heartbeat_interval_s` (60 s) or
`agent.sinks.slurm.heartbeat_interval_s`; `lastTransitionTime` changes only when a
condition's status does. A heartbeat older than a few intervals means the agent is dead
(SIGKILL, node hung): the controller must treat the verdict as unknown, never as healthy.
On a graceful stop the agent sets its conditions to status `Unknown`, reason `AgentStopped`.

Remediation. The controller writes `REQUEST_ANNOTATION`; the agent answers in
`RESULT_ANNOTATION` with the same `id`, idempotently (a request id is acted on at most once):
- `started` first, before the command runs (with `boot_id` for a REBOOT), so an agent
  restarted mid-action never repeats it;
- then `succeeded` or `failed` (with `detail`); a REBOOT is `succeeded` only once the node's
  boot id has changed; a RESET_GPU left `started` by an agent that died is `failed`;
- an unknown action, or remediation switched off on the node, is `failed` at once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuvigil.core.findings import Action, NodeReport, Status

DOMAIN = "gpuvigil.io"
HEALTH_ANNOTATION = f"{DOMAIN}/health"
# Controller -> agent: {"id": str, "action": "RESET_GPU"|"REBOOT", "gpus": [int], "at": iso}
REQUEST_ANNOTATION = f"{DOMAIN}/remediation-request"
# Agent -> controller: {"id": str, "action": str, "result": "started"|"succeeded"|"failed",
# "at": iso, "detail": str, "boot_id": str (REBOOT, with "started")}
RESULT_ANNOTATION = f"{DOMAIN}/remediation-result"
# Controller (`gpuvigil release NODE`) -> agent: an ISO time with zone. The agent forgets the
# Xid events it kept across reboots (REPLACE/INVESTIGATE) that were logged before it.
RELEASED_ANNOTATION = f"{DOMAIN}/released-at"
UNHEALTHY_TAINT = f"{DOMAIN}/unhealthy"
UNVALIDATED_TAINT = f"{DOMAIN}/unvalidated"
SLURM_HEALTH_FIELD = "Extra"
# The agent's latest NodeReport on the node itself (state-file sink), read by the training
# health gate, `slurm-healthcheck` and `npd-plugin --from-state-file`.
STATE_FILE = Path("/run/gpuvigil/report.json")
MAX_FINDINGS = 20  # keeps the summary well under annotation and Slurm field limits


class FindingSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    code: str
    component: str
    status: Status
    action: Action
    fatal: bool = False
    check: str = ""


class HealthSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    v: int = 1
    generated_at: datetime
    status: Status
    findings: list[FindingSummary]
    truncated: int = 0


def summarize(report: NodeReport) -> HealthSummary:
    problems = sorted(
        report.problems, key=lambda f: (-f.status.rank, -f.action.rank, not f.fatal, f.code)
    )
    kept = problems[:MAX_FINDINGS]
    return HealthSummary(
        generated_at=report.generated_at,
        status=report.status,
        findings=[
            FindingSummary(
                code=f.code,
                component=f.component,
                status=f.status,
                action=f.action,
                fatal=f.fatal,
                check=f.check,
            )
            for f in kept
        ],
        truncated=len(problems) - len(kept),
    )


def encode_health(report: NodeReport) -> str:
    return summarize(report).model_dump_json()


def decode_health(text: str | None) -> HealthSummary | None:
    if not text:
        return None
    try:
        return HealthSummary.model_validate(json.loads(text))
    except (ValueError, ValidationError, TypeError):
        return None


def decode_time(text: str | None, *, assume_utc: bool = False) -> datetime | None:
    """An ISO time (`RELEASED_ANNOTATION`, Kubernetes timestamps); None for absent or
    garbage. A time without a zone is None, or UTC with `assume_utc` (Kubernetes' own)."""
    if not text or len(text) > 64:
        return None
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        return t.replace(tzinfo=UTC) if assume_utc else None
    return t
