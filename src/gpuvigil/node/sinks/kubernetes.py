"""Publishes this node's health on its own Kubernetes Node object.

Called by the agent through a SinkWorker (which retries failures with backoff). What it
writes, and nothing else:
- `status.conditions`: one condition per problem family (`core.conditions`), by strategic
  merge keyed on `type`, so conditions owned by the kubelet or node-problem-detector are
  never touched. `lastHeartbeatTime` is refreshed on every write (at least every
  `heartbeat_interval_s`: the controller reads its age to tell a dead agent from a
  healthy node); `lastTransitionTime` changes only when a condition's status changes.
- the `core.wire.HEALTH_ANNOTATION` summary the controller decodes;
- an Event for every condition that turns on or off;
- `core.holders.HOLDERS_ANNOTATION`, which pods hold which GPU, from the kubelet's
  PodResources API (`gpu_holders`; `pod_resources.enabled`), with the summary and on change;
- `core.wire.RESULT_ANNOTATION`, answering `REQUEST_ANNOTATION` (see `remediation`);
and it reads `core.wire.RELEASED_ANNOTATION` (a person released the node: the kernel
watch forgets the Xid events it kept across reboots).
On a graceful stop the conditions are set to Unknown ("AgentStopped"), so `kubectl
describe node` says the verdict is no longer maintained; after a SIGKILL only the
heartbeat age tells (documented in docs/agent.md).
The `kubernetes` client is imported when the sink is built, not at import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import Field

from gpuvigil.core import holders, wire
from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import NodeReport
from gpuvigil.core.signing import sig_annotation
from gpuvigil.node.sinks.gpu_holders import HoldersReader, PodResourcesConfig, content
from gpuvigil.node.sinks.remediation import OnReset, RemediationConfig, Remediator
from gpuvigil.node.sinks.request_auth import Ledger, Trust, TrustConfig, agent_key

log = logging.getLogger("gpuvigil.agent.kubernetes")
COMPONENT = "gpuvigil-agent"
SMP = "application/strategic-merge-patch+json"


class KubernetesConfig(StrictModel):
    enabled: bool = Field(False, description="Publish to this node's Node object.")
    kubeconfig: Path | None = Field(
        None,
        description="None: the pod's service account (in-cluster), else $KUBECONFIG, else "
        "~/.kube/config.",
    )
    context: str | None = Field(None, description="Context of the kubeconfig (None: its current).")
    heartbeat_interval_s: float = Field(
        60.0,
        gt=0,
        description="Re-write the conditions at least this often while nothing "
        "changes. 60 s keeps API load at one patch per node per minute; the controller "
        "treats a heartbeat older than a few of these as a dead agent.",
    )
    request_poll_interval_s: float = Field(
        30.0,
        gt=0,
        description="While nothing changes, read the Node at most this often "
        "(for the controller's remediation requests). With the 60 s heartbeat a node costs "
        "the API server 2 GETs and 2 PATCHes a minute: 5,000 nodes ~ 330 requests/s.",
    )
    request_timeout_s: float = Field(10.0, gt=0, description="Deadline of each API call.")
    events: bool = Field(True, description="Create an Event when a condition turns on or off.")
    event_namespace: str = Field(
        "default", description="Node events live in `default`, like the kubelet's."
    )
    mark_unknown_on_exit: bool = Field(
        True, description="On a graceful stop, set the conditions to Unknown (AgentStopped)."
    )
    remediation: RemediationConfig = Field(
        default_factory=RemediationConfig, description="Acting on the controller's requests."
    )
    trust: TrustConfig = Field(
        default_factory=TrustConfig,
        description="Which messages on the Node are the controller's (signatures; "
        "docs/security.md).",
    )
    pod_resources: PodResourcesConfig = Field(
        default_factory=PodResourcesConfig,
        description="Publishing which pods hold which GPU (docs/per-gpu.md).",
    )


def _ts(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    current: list[dict[str, Any]], report: NodeReport, *, now: datetime
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any] | None]]]:
    """Our conditions as they should be written, and the (new, old) pairs that flipped.

    Pure: `current` is the node's conditions as read; only our families are returned.
    """
    by_type = {c.get("type"): c for c in current}
    out, flipped = [], []
    for cond in report.conditions:
        status = "True" if cond.status else "False"
        old = by_type.get(cond.type)
        same = old is not None and old.get("status") == status
        new = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message or f"gpuvigil: no {cond.type} problem",
            "lastHeartbeatTime": _ts(now),
            "lastTransitionTime": old.get("lastTransitionTime") if same and old else _ts(now),
        }
        if not same and (old is not None or cond.status):
            flipped.append((new, old))
        out.append(new)
    return out, flipped


def _semantic(conds: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(c["type"], c["status"], c["reason"], c["message"]) for c in conds]


class KubernetesSink:
    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        node: str,
        env: dict[str, str] | None = None,
        on_remediation: Callable[[str, str], None] | None = None,
        on_release: Callable[[datetime], None] | None = None,
        on_reject: Callable[[str, str], None] | None = None,
        state_dir: Path | None = None,
        on_reset: OnReset | None = None,
    ) -> None:
        from kubernetes import client

        from gpuvigil.io.kube_client import KubeConfigError, connect

        try:
            api_client = connect(kubeconfig=config.kubeconfig, context=config.context)
        except KubeConfigError as e:
            raise ValueError(f"kubernetes sink: {e}") from e
        self.api = client.CoreV1Api(api_client)
        self.config, self.node = config, node
        self.remediator = Remediator(config.remediation, env=env, on_reset=on_reset)
        self.trust = Trust(config.trust, node=node, on_reject=on_reject)
        self.ledger = Ledger(state_dir)
        self.key = agent_key(state_dir)  # signs our results; the controller pins its public half
        self._on_remediation = on_remediation  # (action, result) when a request finishes
        self._on_release = on_release  # a person released the node (RELEASED_ANNOTATION)
        self._last_written: list[tuple[Any, ...]] | None = None
        self._last_summary: str | None = None
        self.holders = HoldersReader(config.pod_resources) if config.pod_resources.enabled else None
        self._last_holders: str | None = None
        self._last_write = 0.0
        self._last_read = 0.0
        self._timeout = config.request_timeout_s

    def publish(self, report: NodeReport) -> None:
        mono = time.monotonic()
        held = self.holders.read() if self.holders is not None else None
        wanted = _semantic(merge_conditions([], report, now=datetime.now(UTC))[0])
        if (
            self._last_written == wanted
            and _summary_without_time(report) == self._last_summary
            and content(held) == self._last_holders
            and mono - self._last_write < self.config.heartbeat_interval_s
            and mono - self._last_read < self.config.request_poll_interval_s
        ):
            return  # nothing to write and no reason to look: spare the API server
        self._last_read = mono
        obj = self.api.read_node(self.node, _request_timeout=self._timeout)
        current = [c.to_dict() for c in (obj.status.conditions or [])]
        current = [_camel(c) for c in current]
        now = datetime.now(UTC)
        conds, flipped = merge_conditions(current, report, now=now)
        summary = _summary_without_time(report)
        due = time.monotonic() - self._last_write >= self.config.heartbeat_interval_s
        if due or flipped or _semantic(conds) != self._last_written:
            self.api.patch_node_status(
                self.node,
                {"status": {"conditions": conds}},
                _request_timeout=self._timeout,
                _content_type=SMP,
            )
            self._last_written, self._last_write = _semantic(conds), time.monotonic()
        annotations = obj.metadata.annotations or {}
        held_due = held is not None and (
            content(held) != self._last_holders or holders.HOLDERS_ANNOTATION not in annotations
        )
        if (
            due
            or held_due
            or summary != self._last_summary
            or wire.HEALTH_ANNOTATION not in annotations
        ):
            ours = {wire.HEALTH_ANNOTATION: wire.encode_health(report)}
            if held is not None:  # with the summary, so its read_at keeps the heartbeat
                ours[holders.HOLDERS_ANNOTATION] = holders.encode(held)
            if annotations.get(wire.AGENT_KEY_ANNOTATION) != self.key.public_b64():
                ours[wire.AGENT_KEY_ANNOTATION] = self.key.public_b64()  # before any result
            self._annotate(ours)
            self._last_summary, self._last_holders = summary, content(held)
        if self.config.events:
            for new, old in flipped:
                self._event(obj, new, old)
        released = self.trust.admit_release(annotations)
        if released is not None and self._on_release is not None:
            self._on_release(released)
        self._remediate(annotations)

    def _remediate(self, annotations: dict[str, str]) -> None:
        """Act on the controller's request: only a signed, fresh one, and once per id. What
        was done is this agent's ledger's word alone: a result on the Node may be planted
        (a forged `succeeded` or `started`), so it is shown again, never believed."""
        req = self.trust.admit_request(annotations)
        if req is None:
            return
        seen = self.ledger.get(req.id)
        if seen is None and not self.ledger.admits(req):
            text = annotations.get(wire.REQUEST_ANNOTATION, "")
            sig = annotations.get(sig_annotation(wire.REQUEST_ANNOTATION))
            self.trust.reject("remediation-request", text, "older than the ledger", sig)
            return  # it may have run before the ledger was lost: never run it again
        if seen is not None and seen.final:
            if annotations.get(wire.RESULT_ANNOTATION) != wire.encode_result(seen):
                self._show(seen)
            return
        self.remediator.handle(req, seen, self._answer)

    def _answer(self, result: wire.RemediationResult) -> None:
        self.ledger.record(result)  # before the Node: `started` is remembered before acting
        self._show(result)
        if self._on_remediation and result.final:
            self._on_remediation(result.action, result.result)

    def _show(self, result: wire.RemediationResult) -> None:
        """The result on the Node, signed with this agent's key for this node."""
        text = wire.encode_result(result)
        self._annotate(
            {
                wire.RESULT_ANNOTATION: text,
                sig_annotation(wire.RESULT_ANNOTATION): self.key.sign(
                    wire.RESULT_PURPOSE, self.node, text
                ),
                wire.AGENT_KEY_ANNOTATION: self.key.public_b64(),
            }
        )

    def _annotate(self, annotations: dict[str, str]) -> None:
        # Through the status subresource: it carries metadata too, and it is all the agent's
        # account may patch, so the agent can never change a Node's taints or a cordon.
        self.api.patch_node_status(
            self.node,
            {"metadata": {"annotations": annotations}},
            _request_timeout=self._timeout,
            _content_type=SMP,
        )

    def _event(self, obj: Any, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        problem = new["status"] == "True"
        reason = new["reason"] if problem else f"{new['type']}Cleared"
        now = _ts(datetime.now(UTC))
        body = {
            "metadata": {
                "generateName": f"{self.node}.gpuvigil-",
                "namespace": self.config.event_namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": obj.metadata.uid,
            },
            "reason": reason[:128],
            "message": (
                new["message"]
                if problem
                else f"{new['type']} cleared (was {old.get('reason') if old else '?'})"
            )[:1024],
            "type": "Warning" if problem else "Normal",
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.api.create_namespaced_event(
                self.config.event_namespace, body, _request_timeout=self._timeout
            )
        except Exception as e:  # noqa: BLE001 - an Event is informational; conditions matter
            log.warning("creating event %s failed: %s", reason, e)

    def close(self) -> None:
        if not self.config.mark_unknown_on_exit or self._last_written is None:
            return
        now = _ts(datetime.now(UTC))
        conds = [
            {
                "type": t,
                "status": "Unknown",
                "reason": "AgentStopped",
                "message": f"gpuvigil agent stopped at {now}; last: {s} {r}"[:1024],
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for t, s, r, _ in self._last_written
        ]
        try:
            self.api.patch_node_status(
                self.node,
                {"status": {"conditions": conds}},
                _request_timeout=min(self._timeout, 5.0),
                _content_type=SMP,
            )
        except Exception as e:  # noqa: BLE001 - best effort on the way out
            log.warning("marking conditions Unknown failed: %s", e)


def _summary_without_time(report: NodeReport) -> str:
    return wire.summarize(report).model_dump_json(exclude={"generated_at"})


_CAMEL = {"last_heartbeat_time": "lastHeartbeatTime", "last_transition_time": "lastTransitionTime"}


def _camel(c: dict[str, Any]) -> dict[str, Any]:
    out = {_CAMEL.get(k, k): v for k, v in c.items()}
    for k in ("lastHeartbeatTime", "lastTransitionTime"):
        if isinstance(out.get(k), datetime):
            out[k] = _ts(out[k])
    return out
