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

Remediation. The controller writes a `RemediationRequest` in `REQUEST_ANNOTATION` (with
`encode_request`, signed: `core.signing`); the agent reads it with `decode_request` and
answers a `RemediationResult` in `RESULT_ANNOTATION` with the same `id`, idempotently (a
request id is acted on at most once). Both decoders never raise: garbage is (None, why).
Results are bound to their request: the id carries a tag only the controller's key can
make (`core.signing.Signer.tag`), so nobody can plant a result before the request exists;
the agent signs each result with its own key (`AGENT_KEY_ANNOTATION`), and the controller
counts only a result that verifies with the key it pinned for the Node; the agent decides
from its own ledger (`node.sinks.request_auth.Ledger`), never from the result on the Node.
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
from typing import Annotated, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from gpuvigil.core.findings import Action, NodeReport, Status

DOMAIN = "gpuvigil.io"
HEALTH_ANNOTATION = f"{DOMAIN}/health"
REQUEST_ANNOTATION = f"{DOMAIN}/remediation-request"  # controller -> agent: RemediationRequest
RESULT_ANNOTATION = f"{DOMAIN}/remediation-result"  # agent -> controller: RemediationResult
# The agent's own public key (`core.signing.Signer.public_b64`): it signs its results with
# it, and the controller pins it for the Node (`platform.clusters.k8s_pins`).
AGENT_KEY_ANNOTATION = f"{DOMAIN}/agent-key"
REQUEST_PURPOSE, RESULT_PURPOSE = "remediation-request", "remediation-result"  # signed for
# Controller (`gpuvigil release NODE`) -> agent: an ISO time with zone. The agent forgets the
# Xid events it kept across reboots (REPLACE/INVESTIGATE) that were logged before it.
RELEASED_ANNOTATION = f"{DOMAIN}/released-at"
UNHEALTHY_TAINT = f"{DOMAIN}/unhealthy"
UNVALIDATED_TAINT = f"{DOMAIN}/unvalidated"
# A hot spare (`platform.spares`): this taint (NoSchedule) keeps ordinary work off, and
# the label of the same key ("true") is what gang jobs' pods tolerate and select on.
SPARE_TAINT = f"{DOMAIN}/spare"
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
    # The GPU's uuid when the finding names one (its evidence): per-GPU isolation keys its
    # record and the pod->GPU mapping (`core.holders`) by it.
    uuid: str = Field("", max_length=128)


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
                uuid=_uuid_of(f.evidence),
            )
            for f in kept
        ],
        truncated=len(problems) - len(kept),
    )


def _uuid_of(evidence: dict[str, object]) -> str:
    """The GPU uuid a rule put in a finding's evidence (`gpu_uuid`; the Xid rule: `uuid`)."""
    got = evidence.get("gpu_uuid") or evidence.get("uuid")
    return got if isinstance(got, str) and len(got) <= 128 else ""


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


# ---- remediation requests and results ------------------------------------------------

MAX_MESSAGE = 4096  # bytes of JSON; a request or result is ~200
Gpu = Annotated[int, Field(strict=True, ge=0, le=1023)]
Outcome = Literal["started", "succeeded", "failed"]


class RemediationRequest(BaseModel):
    """What the controller asks of one node's agent. `action` stays a string: an action
    this agent does not know is answered `failed`, not ignored, so the controller moves on."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1, max_length=400)  # node names run to 253 characters
    action: str = Field(max_length=32)
    gpus: tuple[Gpu, ...] = Field((), max_length=64)  # none: every GPU
    at: AwareDatetime  # when the controller asked; the agent ignores stale ones


class RemediationResult(BaseModel):
    """The agent's answer to the request with the same `id`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1, max_length=400)
    action: str = Field("", max_length=32)
    result: Outcome
    at: AwareDatetime
    detail: str = Field("", max_length=500)
    boot_id: str = Field("", max_length=64)  # a REBOOT's `started`: the boot it started in

    @property
    def final(self) -> bool:
        return self.result != "started"


M = TypeVar("M", bound=BaseModel)


def _encode(message: BaseModel) -> str:
    return message.model_dump_json(exclude_defaults=True)


def encode_request(request: RemediationRequest) -> str:
    return _encode(request)


def encode_result(result: RemediationResult) -> str:
    return _encode(result)


def decode_message(
    model: type[M], what: str, text: str | None, *, limit: int = MAX_MESSAGE
) -> tuple[M | None, str]:
    """`text` as a `model`, or (None, why) naming the first bad field: never raises."""
    if not text:
        return None, f"no {what}"
    if len(text) > limit:
        return None, f"{what}: longer than {limit} bytes"
    try:
        return model.model_validate_json(text), ""
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "message"
        return None, f"{what}: {where}: {err.get('msg', 'invalid')}"[:200]
    except (ValueError, TypeError, RecursionError) as e:  # belt and braces: never raise
        return None, f"{what}: unreadable ({type(e).__name__})"


def decode_request(text: str | None) -> tuple[RemediationRequest | None, str]:
    """The request in `text`, or (None, why): never raises."""
    return decode_message(RemediationRequest, "remediation request", text)


def decode_result(text: str | None) -> tuple[RemediationResult | None, str]:
    """The result in `text`, or (None, why): never raises."""
    return decode_message(RemediationResult, "remediation result", text)
