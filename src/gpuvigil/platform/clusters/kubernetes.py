"""The Kubernetes adapter: `Cluster` over the API server (kubernetes Python client).

Called by the controller (`gpuvigil controller --cluster kubernetes`), `gpuvigil nodes` and
`gpuvigil release`. What it does to a node:

- block: taint `gpuvigil.io/unhealthy:NoSchedule` (never a cordon: `spec.unschedulable`
  belongs to humans and `kubectl drain`, so a cordon is always someone else's block);
- drain: the Eviction API, which honours PodDisruptionBudgets (429 = refused, try again),
  policy/v1 first and policy/v1beta1 on 404/400 (servers < 1.22 serve only v1beta1; >= 1.25
  only v1); each pod gets the `DisruptionTarget` condition so a Job's podFailurePolicy can
  retry it without counting a failure; past the deadline what is left is deleted;
- reset / reboot: the agent's request annotation (`core.wire.REQUEST_ANNOTATION`), signed
  with the controller's key (`k8s_keys`, `core.signing`) and answered in
  `RESULT_ANNOTATION`; replace: delete the Node (Karpenter / the node group brings a new
  one) or a configured hook command run through `node.probes.exec.run`;
- revalidate: create this validation's preflight pod (`k8s_preflight`: a pod that runs to
  completion and frees its GPUs; its exit, written by the node's kubelet, is the result);
- state: the JSON record in the `gpuvigil.io/state` annotation, written with the
  resourceVersion read (a 409 is `Conflict`).

Lists use raw JSON (`_preload_content=False`): deserialising 5,000 nodes into client
objects costs seconds; `json.loads` costs milliseconds.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from kubernetes import client

from gpuvigil.core import wire
from gpuvigil.core.codes import FAMILIES
from gpuvigil.core.findings import Action, utcnow
from gpuvigil.core.signing import Signer, sig_annotation
from gpuvigil.node.probes import exec as execp
from gpuvigil.platform.clusters.base import (
    AgentResult,
    Conflict,
    DrainStatus,
    Forbidden,
    NodeView,
    NotFound,
    Preflight,
    Record,
    Unavailable,
)
from gpuvigil.platform.clusters.eviction import Drainer, workload
from gpuvigil.platform.clusters.k8s_api import (
    LeaseStore,
    api_call,
    json_object,
    load_api_client,
    when,
)
from gpuvigil.platform.clusters.k8s_keys import load_signer
from gpuvigil.platform.clusters.k8s_preflight import PreflightPods
from gpuvigil.platform.clusters.settings import KubernetesSettings
from gpuvigil.platform.state import STATE_ANNOTATION, State, decode_record

log = logging.getLogger("gpuvigil.clusters.kubernetes")
OUR_TAINTS = (wire.UNHEALTHY_TAINT, wire.UNVALIDATED_TAINT)
IGNORED_TAINTS = ("node.kubernetes.io/unschedulable",)  # the cordon itself, counted once


def pool_label(labels: dict[str, str]) -> str:
    return labels.get("gpuvigil.io/pool", "default")


# nodeInfo fields the circuit breaker may group findings by (a kernel or image rollout).
NODE_INFO_FACTS = {"kernelVersion": "kernel-version", "osImage": "os-image",
                   "containerRuntimeVersion": "container-runtime",
                   "kubeletVersion": "kubelet-version"}  # fmt: skip


def node_facts(node_info: dict[str, Any]) -> dict[str, str]:
    return {name: str(node_info[k]) for k, name in NODE_INFO_FACTS.items() if node_info.get(k)}


class KubernetesCluster:
    name = "kubernetes"
    max_concurrency = 16  # the controller may apply decisions to this many nodes at once

    def __init__(
        self, settings: KubernetesSettings | None = None, *, api_client: Any = None
    ) -> None:
        self.settings = settings or KubernetesSettings()
        self.api_client = api_client or load_api_client(self.settings)
        self.core = client.CoreV1Api(self.api_client)
        self.timeout = self.settings.request_timeout_s
        self._seen: dict[str, tuple[list[dict[str, Any]], str]] = {}
        self._pools: dict[str, str] = {}  # node -> pool, as last read (a drain's grace period)
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.drainer = Drainer(self.core, self.settings, self.calls, self._pages)
        self.preflight = PreflightPods(self.core, self.settings, self.calls, self._pages)
        self._signer: Signer | None = None

    def signer(self) -> Signer:
        """The key agents trust (`k8s_keys`): loaded, or created and published, once."""
        with self._lock:
            if self._signer is None:
                self._signer = load_signer(self.core, self.settings)
            return self._signer

    def _signed(self, annotation: str, purpose: str, node: str, text: str) -> dict[str, str]:
        sig = self.signer().sign(purpose, node, text)
        return {annotation: text, sig_annotation(annotation): sig}

    # ---- reading --------------------------------------------------------------------

    def _raw(self, op: str, call: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
        self.calls[op] += 1
        resp = api_call(
            lambda: call(*args, _preload_content=False, _request_timeout=self.timeout, **kw)
        )
        return json.loads(resp.data)

    def _pages(self, op: str, call: Callable[..., Any], **kw: Any) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            extra = {"_continue": token} if token else {}
            page = self._raw(op, call, limit=self.settings.list_page_size, **kw, **extra)
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def _running(self, node: str | None = None) -> Counter[str]:
        sel = "status.phase!=Succeeded,status.phase!=Failed"
        if node:
            sel += f",spec.nodeName={node}"
        counts: Counter[str] = Counter()
        for pod in self._pages(
            "list_pods", self.core.list_pod_for_all_namespaces, field_selector=sel
        ):
            where = pod.get("spec", {}).get("nodeName")
            if where and workload(pod):
                counts[where] += 1
        return counts

    def list_nodes(self) -> list[NodeView]:
        sel = {"label_selector": self.settings.node_selector} if self.settings.node_selector else {}
        nodes = list(self._pages("list_nodes", self.core.list_node, **sel))
        for raw in nodes:
            self._remember(raw)
        running = self._counts(nodes)
        runs = self.preflight.results()
        return [
            self._view(n, running[n["metadata"]["name"]], runs.get(n["metadata"]["name"]))
            for n in nodes
        ]

    def _counts(self, nodes: list[dict[str, Any]]) -> Counter[str]:
        """Running pods per node. Only a DRAINING node's count matters to the policy, so by
        default only those are listed (one field-selected list each); many of them, or
        `count_pods: all` (`gpuvigil nodes`), take one paged list of every pod instead."""
        if self.settings.count_pods == "all":
            return self._running()
        draining = []
        for n in nodes:
            text = (n["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
            rec = decode_record(text) if text and "DRAINING" in text else None
            if rec is not None and rec.state is State.DRAINING:
                draining.append(n["metadata"]["name"])
        if len(draining) > 20:
            return self._running()
        counts: Counter[str] = Counter()
        for name in draining:
            counts.update(self._running(name))
        return counts

    def get_node(self, name: str) -> NodeView:
        raw = self._raw("get_node", self.core.read_node, name)
        self._remember(raw)
        return self._view(raw, self._running(name)[name], self.preflight.results().get(name))

    def _view(self, raw: dict[str, Any], running: int, preflight: Preflight | None) -> NodeView:
        meta, spec, status = raw["metadata"], raw.get("spec", {}), raw.get("status", {})
        ann = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        health_text = ann.get(wire.HEALTH_ANNOTATION)
        health = wire.decode_health(health_text)
        beats = [health.generated_at] if health else []
        for cond in status.get("conditions") or []:  # the agent's conditions carry heartbeats
            if cond.get("type") in FAMILIES and health is not None:
                beat = when(cond.get("lastHeartbeatTime"))
                if beat:
                    beats.append(beat)
        taints = spec.get("taints") or []
        others = ["cordon"] if spec.get("unschedulable") else []
        others += [
            f"taint:{t['key']}"
            for t in taints
            if t.get("key") not in OUR_TAINTS + IGNORED_TAINTS
            and t.get("effect") in ("NoSchedule", "NoExecute")
        ]
        keys = {t.get("key") for t in taints}
        rec_text = ann.get(STATE_ANNOTATION)
        record = decode_record(rec_text)
        res = json_object(ann.get(wire.RESULT_ANNOTATION))
        return NodeView(
            name=meta["name"],
            pool=pool_label(labels),
            labels=labels,
            health=health,
            health_error=None if health else ("unreadable" if health_text else "absent"),
            heartbeat_at=max(beats) if beats else None,
            record=record,
            record_error="unreadable" if rec_text and record is None else None,
            blocked_by_us=wire.UNHEALTHY_TAINT in keys,
            blocked_by_others=tuple(others),
            unvalidated=wire.UNVALIDATED_TAINT in keys,
            running=running,
            preflight=preflight,
            agent_result=AgentResult(
                str(res.get("id", "")),
                res.get("result") == "succeeded",
                when(res.get("at")),
                str(res.get("detail", "")),
            )
            # "started" (the agent records it before acting) is not an answer yet.
            if res and res.get("result") in ("succeeded", "failed")
            else None,
            boot_id=(status.get("nodeInfo") or {}).get("bootID", ""),
            provider_id=str(spec.get("providerID") or ""),
            version=meta.get("resourceVersion", ""),
            replace_supported=self.settings.replace != "none",
            attributes=node_facts(status.get("nodeInfo") or {}),
        )

    # ---- writing --------------------------------------------------------------------

    def _patch_node(self, op: str, name: str, body: dict[str, Any]) -> None:
        self.calls[op] += 1
        resp = api_call(
            lambda: self.core.patch_node(
                name, body, _preload_content=False, _request_timeout=self.timeout
            )
        )
        self._remember(json.loads(resp.data))

    def _remember(self, raw: dict[str, Any]) -> None:
        """The node's taints and resourceVersion as last seen (a list, a get, our own patch
        response), so a taint change needs no extra GET; a stale entry costs one Conflict."""
        meta = raw.get("metadata") or {}
        if meta.get("name"):
            with self._lock:
                self._seen[meta["name"]] = (
                    list(raw.get("spec", {}).get("taints") or []),
                    meta.get("resourceVersion", ""),
                )
                self._pools[meta["name"]] = pool_label(meta.get("labels") or {})

    def _set_taints(self, name: str, change: Callable[[list[dict[str, Any]]], list[Any]]) -> None:
        """Read-modify-write of the taint list with the resourceVersion (no lost updates)."""
        for attempt in range(3):
            with self._lock:
                seen = self._seen.pop(name, None) if attempt == 0 else None
            if seen is None:
                raw = self._raw("get_node", self.core.read_node, name)
                seen = (raw.get("spec", {}).get("taints") or [], raw["metadata"]["resourceVersion"])
            taints, version = seen
            new = change(list(taints))
            if new == taints:
                with self._lock:
                    self._seen[name] = seen
                return
            body = {"metadata": {"resourceVersion": version}, "spec": {"taints": new}}
            try:
                self._patch_node("taint", name, body)
                return
            except Conflict:
                if attempt == 2:
                    raise

    def block(self, name: str, *, reason: str) -> None:
        taint = {"key": wire.UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}
        self._set_taints(
            name, lambda ts: ts if any(t.get("key") == taint["key"] for t in ts) else [*ts, taint]
        )

    def unblock(self, name: str) -> None:
        self._set_taints(name, lambda ts: [t for t in ts if t.get("key") not in OUR_TAINTS])

    def store(self, name: str, record: Record, *, version: str = "") -> None:
        meta: dict[str, Any] = {"annotations": {STATE_ANNOTATION: record.encode()}}
        if version:
            meta["resourceVersion"] = version
        self._patch_node("store", name, {"metadata": meta})

    def request(self, name: str, *, action: Action, request_id: str, gpus: list[int]) -> None:
        if action not in (Action.RESET_GPU, Action.REBOOT):
            raise Forbidden(f"the agent cannot {action.value}")
        body = {"id": request_id, "action": action.value, "gpus": gpus, "at": utcnow().isoformat()}
        text = json.dumps(body, separators=(",", ":"))
        ann = self._signed(wire.REQUEST_ANNOTATION, "remediation-request", name, text)
        self._patch_node("request", name, {"metadata": {"annotations": ann}})

    def mark_released(self, name: str, *, at: datetime) -> None:
        ann = self._signed(wire.RELEASED_ANNOTATION, "released-at", name, at.isoformat())
        self._patch_node("released", name, {"metadata": {"annotations": ann}})

    def revalidate(self, name: str, *, since: datetime) -> int:
        """Start this validation's preflight pod (once: its name is derived from `since`);
        the node's older runs are deleted. See `k8s_preflight`."""
        return self.preflight.start(name, since=since)

    @property
    def replace_removes_node(self) -> bool:
        """A replacement deletes the Node (its successor joins under a name of its own)."""
        return self.settings.replace == "delete-node"

    def replace(self, name: str, *, reason: str) -> None:
        mode = self.settings.replace
        if mode == "none":
            raise Forbidden("replacement is switched off (controller.kubernetes.replace: none)")
        if mode == "hook":
            argv = [a.replace("{node}", name) for a in self.settings.replace_hook]
            if not argv:
                raise Forbidden("controller.kubernetes.replace_hook is empty")
            res = execp.run(argv, timeout_s=self.settings.hook_timeout_s)
            if not res.ok:
                raise Unavailable(
                    f"replace hook failed: {res.error or res.returncode} {res.stderr_tail(300)}"
                )
            return
        self.calls["delete_node"] += 1
        try:
            api_call(lambda: self.core.delete_node(name, _request_timeout=self.timeout))
        except NotFound:
            pass  # already gone, which is what we wanted

    def record_event(self, name: str, *, reason: str, message: str, warning: bool = False) -> None:
        now = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
        ns = self.settings.event_namespace
        body = {
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": ns},
            "involvedObject": {"kind": "Node", "name": name, "apiVersion": "v1", "uid": name},
            "reason": reason[:128],
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "gpuvigil-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.calls["event"] += 1
        api_call(lambda: self.core.create_namespaced_event(ns, body, _request_timeout=self.timeout))

    # ---- draining -------------------------------------------------------------------

    def lease_store(self) -> LeaseStore:
        return LeaseStore(self.api_client, self.settings)

    def drain(self, name: str, *, deadline: datetime, reason: str) -> DrainStatus:
        with self._lock:
            pool = self._pools.get(name)
        if pool is None:
            pool = self.get_node(name).pool
        grace = self.settings.eviction_grace_for(pool)
        return self.drainer.drain(name, deadline=deadline, reason=reason, grace_s=grace)
