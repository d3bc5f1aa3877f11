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
  one) or a configured hook command run through `io.exec.run`;
- revalidate: create this validation's preflight pod (`k8s_preflight`: a pod that runs to
  completion and frees its GPUs; its exit, written by the node's kubelet, is the result);
- state: the JSON record in the `gpuvigil.io/state` annotation, written with the
  resourceVersion read (a 409 is `Conflict`); with the block taint in the same PATCH when
  the decision blocks (one write per node in a fault storm, not two);
- read: one LIST, then a WATCH (`clusters.k8s_watch`); a node's `NodeView` is rebuilt only
  when its resourceVersion (or its running-pod count) changed;
- Events: queued and sent by one background thread, as client-go's recorder does (a fault
  storm's thousand Events do not hold up its decisions); a full queue drops and counts;
- every write asks `fence` first and caps its timeout with what the fence returns.

Lists use raw JSON (`_preload_content=False`): deserialising 5,000 nodes into client
objects costs seconds; `json.loads` costs milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import client

from gpuvigil.core import wire
from gpuvigil.core.codes import FAMILIES
from gpuvigil.core.findings import Action, utcnow
from gpuvigil.core.signing import BadKey, Signer, Verifier, sig_annotation
from gpuvigil.io import exec as execp
from gpuvigil.platform.clusters import gpu_holders
from gpuvigil.platform.clusters.base import (
    AgentResult,
    ClusterError,
    Conflict,
    DrainStatus,
    Fence,
    Forbidden,
    GpuEnforcement,
    NodeView,
    NotFound,
    Preflight,
    Record,
    Unavailable,
    unfenced,
)
from gpuvigil.platform.clusters.eviction import Drainer, workload
from gpuvigil.platform.clusters.k8s_api import (
    LeaseStore,
    api_call,
    load_api_client,
    when,
)
from gpuvigil.platform.clusters.k8s_dra import DeviceTaints
from gpuvigil.platform.clusters.k8s_events import EventRecorder
from gpuvigil.platform.clusters.k8s_keys import load_signer
from gpuvigil.platform.clusters.k8s_pins import AgentPins
from gpuvigil.platform.clusters.k8s_preflight import PreflightPods
from gpuvigil.platform.clusters.k8s_serving import ServingPools
from gpuvigil.platform.clusters.k8s_watch import NodeWatch
from gpuvigil.platform.clusters.settings import KubernetesSettings
from gpuvigil.platform.isolation import ISOLATION_ANNOTATION, Isolation
from gpuvigil.platform.state import (
    INTENT_ANNOTATION,
    POOL_LABEL,
    STATE_ANNOTATION,
    Intent,
    State,
    decode_intent,
    decode_record,
    pool_of_labels,
)

log = logging.getLogger("gpuvigil.clusters.kubernetes")
OUR_TAINTS = (wire.UNHEALTHY_TAINT, wire.UNVALIDATED_TAINT)  # what `unblock` lifts
# gpuvigil's own, never a block by someone else; lifted only by `unmake_spare`
SPARE_TAINT = {"key": wire.SPARE_TAINT, "value": "true", "effect": "NoSchedule"}
IGNORED_TAINTS = ("node.kubernetes.io/unschedulable",)  # the cordon itself, counted once
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's extended resource
BLOCK_TAINT = {"key": wire.UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}
T = TypeVar("T")


# nodeInfo fields the circuit breaker may group findings by (a kernel or image rollout).
NODE_INFO_FACTS = {"kernelVersion": "kernel-version", "osImage": "os-image",
                   "containerRuntimeVersion": "container-runtime",
                   "kubeletVersion": "kubelet-version"}  # fmt: skip


def node_facts(node_info: dict[str, Any]) -> dict[str, str]:
    return {name: str(node_info[k]) for k, name in NODE_INFO_FACTS.items() if node_info.get(k)}


class KubernetesCluster:
    name = "kubernetes"
    max_concurrency = 16  # the controller may apply decisions to this many nodes at once
    fence: Fence = staticmethod(unfenced)  # the controller sets its leader elector's

    def __init__(
        self,
        settings: KubernetesSettings | None = None,
        *,
        api_client: Any = None,
        pool_label: str = POOL_LABEL,
    ) -> None:
        self.settings = settings or KubernetesSettings()
        self.pool_label = pool_label  # the controller's `safety.pool_label`
        self.api_client = api_client or load_api_client(self.settings)
        self.core = client.CoreV1Api(self.api_client)
        self.timeout = self.settings.request_timeout_s
        self.calls: Counter[str] = Counter()
        self.watch = NodeWatch(self.core, self.settings, self.calls)
        # name -> (resourceVersion, running pods, preflight result, view)
        self._views: dict[str, tuple[str, int, Preflight | None, NodeView]] = {}
        self._lock = threading.Lock()
        self.drainer = Drainer(
            self.core, self.settings, self.calls, self._pages, write=self._write,
            fence=lambda: self.fence(),  # noqa: PLW0108  (the controller sets it later)
        )  # fmt: skip
        self.preflight = PreflightPods(
            self.core,
            self.settings,
            self.calls,
            self._pages,
            write=self._write,
            pool_label=self.pool_label,
        )
        self.events = EventRecorder(self.core, self.settings, write=self._write)
        # serving pools' demand, replicas and make-before-break (the capacity gate)
        self.serving = ServingPools(
            self.api_client, timeout_s=self.timeout, calls=self.calls, write=self._write,
            pages=self._pages, watch=self.watch, gpu_resource=self.settings.gpu_resource,
        )  # fmt: skip
        # per-GPU isolation with DRA: DeviceTaintRules, ResourceSlices, ResourceClaims
        self.dra = DeviceTaints(self.api_client, timeout_s=self.timeout, write=self._write,
                                calls=self.calls)  # fmt: skip
        self._signer: Signer | None = None
        self.pins = AgentPins(self.core, self.settings, self._write)
        self._doubted: set[str] = set()  # results already logged as not believed

    def _write(self, op: str, call: Callable[[float], T]) -> T:
        """Every write: the fence first (raises Fenced, sending nothing), then the call
        with a timeout no longer than the time the fence says this replica has left."""
        left = self.fence()
        self.calls[op] += 1
        return api_call(lambda: call(min(self.timeout, max(0.1, left))))

    def signer(self) -> Signer:
        """The key agents trust (`k8s_keys`): loaded, or created and published, once."""
        with self._lock:
            if self._signer is None:
                self.fence()  # it may create the key: a write like any other
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
        nodes = self.watch.nodes()
        running, counted = self._counts(nodes)
        runs = self.preflight.results()
        views: list[NodeView] = []
        cache = self._views
        for raw in nodes:
            name = raw["metadata"]["name"]
            rv = str(raw["metadata"].get("resourceVersion") or "")
            known = counted is None or name in counted
            n, pf = (running[name] if known else -1), runs.get(name)
            hit = cache.get(name)
            if hit is None or hit[0] != rv or hit[1] != n or hit[2] != pf:
                hit = (rv, n, pf, self._view(raw, max(n, 0), pf, running_known=known))
                cache[name] = hit
            views.append(hit[3])
        if len(cache) > len(nodes):
            present = {n["metadata"]["name"] for n in nodes}
            self._views = {k: v for k, v in cache.items() if k in present}
        return views

    def close(self) -> None:
        """Stop the node watch (tests; a process that exits needs nothing)."""
        self.watch.stop()

    def watch_age_s(self) -> float:
        """Seconds since the node watch last heard anything (metrics, /healthz)."""
        return self.watch.age_s()

    def watch_blind(self, after_s: float) -> str | None:
        """Why the node watch cannot see (refused, or failing for `after_s`), or None."""
        return self.watch.blind(after_s)

    def _counts(self, nodes: list[dict[str, Any]]) -> tuple[Counter[str], set[str] | None]:
        """Running pods per node, and the nodes counted (None: all). Only a DRAINING or a
        QUARANTINED node's count matters to the policy (a quarantined node's work moves
        off while a finding slows it), and a hot spare's (to see it used, and as room for
        moved work), so by default only those are listed (one field-selected list each);
        many of them, or `count_pods: all` (`gpuvigil nodes`), take one paged list of
        every pod instead. A node not counted is `running_known=False`: never room."""
        if self.settings.count_pods == "all":
            return self._running(), None
        listed = []
        for n in nodes:
            if any(t.get("key") == wire.SPARE_TAINT for t in n.get("spec", {}).get("taints") or []):
                listed.append(n["metadata"]["name"])  # a spare's work: a used one is seen
                continue
            text = (n["metadata"].get("annotations") or {}).get(STATE_ANNOTATION)
            maybe = text and ("DRAINING" in text or "QUARANTINED" in text)
            rec = decode_record(text) if maybe else None
            if rec is not None and rec.state in (State.DRAINING, State.QUARANTINED):
                listed.append(n["metadata"]["name"])
        if len(listed) > 20:
            return self._running(), None
        counts: Counter[str] = Counter()
        for name in listed:
            counts.update(self._running(name))
        return counts, set(listed)

    def get_node(self, name: str) -> NodeView:
        raw = self._raw("get_node", self.core.read_node, name)
        self.watch.remember(raw)
        return self._view(raw, self._running(name)[name], self.preflight.results().get(name))

    def _view(
        self,
        raw: dict[str, Any],
        running: int,
        preflight: Preflight | None,
        *,
        running_known: bool = True,
    ) -> NodeView:
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
            if t.get("key") not in (*OUR_TAINTS, *IGNORED_TAINTS, wire.SPARE_TAINT)
            and t.get("effect") in ("NoSchedule", "NoExecute")
        ]
        keys = {t.get("key") for t in taints}
        rec_text = ann.get(STATE_ANNOTATION)
        record = decode_record(rec_text)
        res = self._agent_result(meta, ann)
        return NodeView(
            name=meta["name"],
            pool=pool_of_labels(labels, label=self.pool_label),
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
            running_known=running_known,
            preflight=preflight,
            agent_result=res,
            boot_id=(status.get("nodeInfo") or {}).get("bootID", ""),
            provider_id=str(spec.get("providerID") or ""),
            version=meta.get("resourceVersion", ""),
            replace_supported=self.settings.replace != "none",
            attributes=node_facts(status.get("nodeInfo") or {}),
            intent=decode_intent(ann.get(INTENT_ANNOTATION)),
            gpu_capacity=_count((status.get("capacity") or {}).get(GPU_RESOURCE)),
            gpu_allocatable=_count((status.get("allocatable") or {}).get(GPU_RESOURCE)),
            isolation_text=ann.get(ISOLATION_ANNOTATION),
            # the taint is what keeps ordinary work off: it alone makes a spare
            spare=wire.SPARE_TAINT in keys,
        )

    def _agent_result(self, meta: dict[str, Any], ann: dict[str, str]) -> AgentResult | None:
        """The agent's final answer, only when signed with the key pinned for this Node;
        its id is the request's without the tag `request` added. `started` (recorded before
        acting) is not an answer yet."""
        text = ann.get(wire.RESULT_ANNOTATION)
        res, _ = wire.decode_result(text)
        if res is None or not res.final:
            return None
        name = meta["name"]
        verifier = self.pins.verifier(name, str(meta.get("uid") or ""))
        sig = ann.get(sig_annotation(wire.RESULT_ANNOTATION))
        why = (
            verifier.verify(wire.RESULT_PURPOSE, name, text, sig)
            if verifier is not None
            else "no agent key pinned for this node"
        )
        if why:
            if text not in self._doubted:
                if len(self._doubted) > 10_000:
                    self._doubted.clear()
                self._doubted.add(text or "")
                self.calls["result_not_believed"] += 1
                log.warning("not believing the remediation result on %s: %s", name, why)
            return None
        return AgentResult(_untagged(res.id), res.result == "succeeded", res.at, res.detail)

    # ---- writing --------------------------------------------------------------------

    def _pin_agent(self, name: str) -> None:
        """Pin the key this node's agent publishes, if it has no pin yet (`k8s_pins`)."""
        raw = self.watch.get(name)
        if raw is None:
            raw = self._raw("get_node", self.core.read_node, name)
            self.watch.remember(raw)
        meta = raw["metadata"]
        key = (meta.get("annotations") or {}).get(wire.AGENT_KEY_ANNOTATION, "")
        try:
            Verifier.from_b64(key)
        except BadKey:
            return  # none yet, or not a key: nothing to pin
        if self.pins.pin(name, str(meta.get("uid") or ""), key):
            self._views.pop(name, None)  # its result may count now

    def _patch_node(self, op: str, name: str, body: dict[str, Any]) -> None:
        resp = self._write(
            op,
            lambda t: self.core.patch_node(name, body, _preload_content=False, _request_timeout=t),
        )
        self.watch.remember(json.loads(resp.data))

    def _latest(self, name: str, *, fresh: bool) -> tuple[list[dict[str, Any]], str]:
        """The node's taints and resourceVersion: from the watch's cache (which our own
        patch responses update), or read now; a stale one costs a Conflict and a re-read."""
        raw = None if fresh else self.watch.get(name)
        if raw is None:
            raw = self._raw("get_node", self.core.read_node, name)
            self.watch.remember(raw)
        return list(raw.get("spec", {}).get("taints") or []), raw["metadata"]["resourceVersion"]

    def _set_taints(
        self,
        name: str,
        change: Callable[[list[dict[str, Any]]], list[Any]],
        *,
        labels: dict[str, str | None] | None = None,
    ) -> None:
        """Read-modify-write of the taint list with the resourceVersion (no lost updates);
        `labels` set (None: removed) in the same PATCH."""
        for attempt in range(3):
            taints, version = self._latest(name, fresh=attempt > 0)
            new = change(list(taints))
            if new == taints:
                return
            meta: dict[str, Any] = {"resourceVersion": version}
            if labels:
                meta["labels"] = labels
            body = {"metadata": meta, "spec": {"taints": new}}
            try:
                self._patch_node("taint", name, body)
                return
            except Conflict:
                if attempt == 2:
                    raise

    def block(self, name: str, *, reason: str) -> None:
        self._set_taints(name, _with_block)

    def unblock(self, name: str) -> None:
        self._set_taints(name, lambda ts: [t for t in ts if t.get("key") not in OUR_TAINTS])

    def make_spare(self, name: str) -> bool:
        if self._running(name)[name]:  # only an idle node: the taint would evict nothing
            return False
        self._set_taints(
            name,
            lambda ts: ts if any(t.get("key") == wire.SPARE_TAINT for t in ts)
            else [*ts, dict(SPARE_TAINT)],
            labels={wire.SPARE_TAINT: "true"},
        )  # fmt: skip
        return True

    def unmake_spare(self, name: str) -> None:
        self._set_taints(
            name,
            lambda ts: [t for t in ts if t.get("key") != wire.SPARE_TAINT],
            labels={wire.SPARE_TAINT: None},
        )

    def store(self, name: str, record: Record, *, version: str = "", block: bool = False) -> None:
        meta: dict[str, Any] = {"annotations": {STATE_ANNOTATION: record.encode()}}
        body: dict[str, Any] = {"metadata": meta}
        if version:
            meta["resourceVersion"] = version
        if block:
            # The taint list is replaced whole, so it must be the one of `version`: with a
            # version the API server refuses (409) a list from any other.
            taints, seen = self._latest(name, fresh=not version)
            meta["resourceVersion"] = version or seen
            new = _with_block(taints)
            if new != taints:
                body["spec"] = {"taints": new}
        self._patch_node("store", name, body)
        try:
            self._pin_agent(name)  # early: the first write to a node, before any request
        except ClusterError as e:
            log.warning("pinning the agent key of %s failed (retried): %s", name, e)

    def publish(self, name: str, intent: Intent) -> None:
        body = {"metadata": {"annotations": {INTENT_ANNOTATION: intent.encode()}}}
        self._patch_node("publish", name, body)

    def request(self, name: str, *, action: Action, request_id: str, gpus: list[int]) -> None:
        if action not in (Action.RESET_GPU, Action.REBOOT):
            raise Forbidden(f"the agent cannot {action.value}")
        self._pin_agent(name)
        # The id carries a tag only our key makes: nobody can write a result for a request
        # before it exists, and a re-sent request (after a restart) keeps its id.
        tagged = f"{request_id}.{self.signer().tag(request_id)}"
        body = wire.RemediationRequest(
            id=tagged, action=action.value, gpus=tuple(gpus), at=utcnow()
        )
        text = wire.encode_request(body)
        ann = self._signed(wire.REQUEST_ANNOTATION, wire.REQUEST_PURPOSE, name, text)
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
            left = self.fence()
            self.calls["replace_hook"] += 1
            res = execp.run(argv, timeout_s=min(self.settings.hook_timeout_s, left))
            if not res.ok:
                raise Unavailable(
                    f"replace hook failed: {res.error or res.returncode} {res.stderr_tail(300)}"
                )
            return
        try:
            self._write("delete_node", lambda t: self.core.delete_node(name, _request_timeout=t))
        except NotFound:
            pass  # already gone, which is what we wanted
        self.watch.forget(name)
        try:
            self.pins.forget(name)  # a node joining under this name is a new machine
        except ClusterError as e:  # the Node is gone either way; a new one has a new uid
            log.warning("forgetting the agent key pinned for %s failed: %s", name, e)

    def record_event(self, name: str, *, reason: str, message: str, warning: bool = False) -> None:
        """Queued; the recorder's thread creates the Event (fenced like any write)."""
        self.events.record(name, reason=reason, message=message, warning=warning)

    # ---- one GPU (platform.isolation; clusters.base.GpuIsolating) ----------------------

    def gpu_holders(self, name: str, gpu_uuid: str) -> list[str] | None:
        """The pods holding that GPU (`clusters.gpu_holders`: the pods' own
        allocatedResourcesStatus, else the agent's fresh PodResources annotation); None
        when unknown. Read fresh: the watch's copy may predate the agent's last write."""
        raw = self._raw("get_node", self.core.read_node, name)
        self.watch.remember(raw)
        sel = f"spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed"
        pods = [p for p in self._pages("list_pods", self.core.list_pod_for_all_namespaces,
                                       field_selector=sel) if workload(p)]  # fmt: skip
        return gpu_holders.read(raw, gpu_uuid, utcnow(), pods=pods).listed()

    def evict(self, name: str, pods: list[str], *, deadline: datetime, reason: str) -> DrainStatus:
        raw = self.watch.get(name)
        labels = (raw or {}).get("metadata", {}).get("labels") or {}
        grace = self.settings.eviction_grace_for(pool_of_labels(labels, label=self.pool_label))
        return self.drainer.evict_pods(pods, deadline=deadline, reason=reason, grace_s=grace)

    def gpu_enforcement(
        self, node: NodeView, gpu_uuid: str, *, plugin_agrees: bool, record: Isolation | None
    ) -> GpuEnforcement | None:
        """DRA's way when the API server serves DeviceTaintRule and a ResourceSlice has the
        GPU (`k8s_dra.DeviceTaints.enforcement`); None: the device plugin's way."""
        if record is not None and record.scope != "dra":
            return None  # a record keeps the way it was isolated
        way = self.dra.enforcement(node.name, gpu_uuid, plugin_agrees=plugin_agrees,
                                   device=record.device if record else None)  # fmt: skip
        if way is None or not way.holders:
            return way
        # A claim stays reserved for a pod that is gone until the resourceclaim controller
        # catches up: only the node's live pods hold the GPU.
        sel = f"spec.nodeName={node.name},status.phase!=Succeeded,status.phase!=Failed"
        live = {f"{p['metadata'].get('namespace')}/{p['metadata'].get('name')}"
                for p in self._pages("list_pods", self.core.list_pod_for_all_namespaces,
                                     field_selector=sel)}  # fmt: skip
        return dataclasses.replace(way, holders=[h for h in way.holders if h in live])

    def enforce_gpu(self, name: str, record: Isolation) -> str:
        """The DeviceTaintRule, None then NoSchedule ("" done; else why not)."""
        if record.scope != "dra":
            return ""
        return self.dra.isolate(record.device, gpu_uuid=record.gpu_uuid, reason=record.code)

    def release_gpu(self, name: str, record: Isolation) -> None:
        """Delete the record's DeviceTaintRule (a device-plugin record has none)."""
        if record.scope == "dra":
            self.dra.release_device(record.device)

    def store_isolation(self, name: str, text: str | None) -> None:
        """The isolation record in its Node annotation (None: removed). An annotation, not
        a CRD: it needs nothing installed and is one object with the node's state record
        (docs/per-gpu.md)."""
        self._patch_node("isolation", name, {"metadata": {"annotations": {
            ISOLATION_ANNOTATION: text}}})  # fmt: skip

    # ---- draining -------------------------------------------------------------------

    def lease_store(self) -> LeaseStore:
        return LeaseStore(self.api_client, self.settings, calls=self.calls)

    def drain(self, name: str, *, deadline: datetime, reason: str) -> DrainStatus:
        raw = self.watch.get(name)  # the node as last seen, for its pool label
        if raw is not None:
            pool = pool_of_labels(raw["metadata"].get("labels") or {}, label=self.pool_label)
        else:
            pool = self.get_node(name).pool
        grace = self.settings.eviction_grace_for(pool)
        return self.drainer.drain(name, deadline=deadline, reason=reason, grace_s=grace)


TAG_LEN = 22  # `Signer.tag`: 16 bytes, base64url


def _untagged(request_id: str) -> str:
    head, _, tag = request_id.rpartition(".")
    return head if head and len(tag) == TAG_LEN else request_id


def _count(quantity: object) -> int | None:
    """A Kubernetes quantity of a countable resource ("8") -> 8; None for anything else."""
    text = str(quantity).strip() if quantity is not None else ""
    return int(text) if text.isdigit() and len(text) <= 6 else None


def _with_block(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if any(t.get("key") == BLOCK_TAINT["key"] for t in taints):
        return taints
    return [*taints, dict(BLOCK_TAINT)]
