"""Serving pools on Kubernetes: what the capacity gate (`platform.capacity`) reads, and the
two writes of make-before-break. Used by `clusters.kubernetes.KubernetesCluster.serving`.

Reads: the pool's pods (its selector, else the workload's `spec.selector.matchLabels`); the
demand sources (HPA `status.desiredReplicas` through autoscaling/v2, or v2beta2 on servers
before 1.23; the workload's Scale subresource; PromQL, `clusters.promql`); the HPA's
`maxReplicas`; the GPUs free on schedulable nodes; the make-before-break mark.

Writes: scale up (the mark annotation first, then the HPA's `minReplicas` so the HPA does
not scale the replicas back, then the Scale subresource) and restore (the reverse). Every
write goes through the adapter's fenced `write`.

Built-in groups are read through the dynamic (custom objects) API: raw JSON, and one code
path for autoscaling/v2 and v2beta2, which the typed client no longer has.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, TypeVar

from kubernetes import client

from gpuvigil.core import holders as holders_wire
from gpuvigil.core.findings import utcnow
from gpuvigil.core.wire import DOMAIN
from gpuvigil.platform.capacity import Demand, PoolState, Replica, ScaleMark, Step
from gpuvigil.platform.clusters import promql
from gpuvigil.platform.clusters.base import ClusterError, NotFound
from gpuvigil.platform.clusters.k8s_api import api_call, when
from gpuvigil.platform.serving_pool import ServingPool

T = TypeVar("T")
Ref = tuple[str, str, str, str, str]  # group, version, namespace, plural, name
CONDITION = "HeldForCapacity"  # on the Node whose step the gate holds
MARK_ANNOTATION = f"{DOMAIN}/serving-scale-up"  # on the workload: the make-before-break
HPA_VERSIONS = ("v2", "v2beta2")  # v2 from 1.23; 1.20-1.25 serve v2beta2
PLURALS = {"Deployment": "deployments", "StatefulSet": "statefulsets"}
_BLOCKING = ("NoSchedule", "NoExecute")


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _gpus_requested(pod: dict[str, Any], resource: str) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        want = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        try:
            total += int(str(want or 0))
        except ValueError:
            continue
    return total


def decode_mark(text: str | None) -> ScaleMark | None:
    """The mark on the workload; garbage is no mark (never raises)."""
    try:
        d = json.loads(text) if text else None
        if not isinstance(d, dict):
            return None
        at = when(str(d["at"]))
        if at is None:
            return None
        om, hd = d.get("original_min"), d.get("hpa_desired")
        return ScaleMark(
            str(d["node"]),
            int(d["added"]),
            int(d["original"]),
            at,
            int(om) if om is not None else None,
            int(hd) if hd is not None else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


def encode_mark(m: ScaleMark) -> str:
    return json.dumps(
        {
            "node": m.node,
            "added": m.added,
            "original": m.original,
            "at": m.at.isoformat(),
            "original_min": m.original_min,
            "hpa_desired": m.hpa_desired,
        },
        separators=(",", ":"),
    )


class ServingPools:
    def __init__(
        self,
        api_client: Any,
        *,
        timeout_s: float,
        calls: Counter[str],
        write: Callable[[str, Callable[[float], Any]], Any],
        pages: Callable[..., Iterator[dict[str, Any]]],
        watch: Any,
        gpu_resource: str = "nvidia.com/gpu",
    ) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.timeout, self.calls, self._write, self._pages = timeout_s, calls, write, pages
        self.gpu_resource, self.watch = gpu_resource, watch
        self._hpa_version: str | None = None  # learnt on first use

    # ---- the node's condition -----------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.watch.nodes())

    def _condition(self, name: str) -> dict[str, Any] | None:
        raw = self.watch.get(name)
        if raw is None:
            self.calls["get_node"] += 1
            resp = api_call(
                lambda: self.core.read_node(
                    name, _preload_content=False, _request_timeout=self.timeout
                )
            )
            raw = json.loads(resp.data)
        conds = (raw.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c.get("type") == CONDITION), None)

    def held_since(self, name: str) -> datetime | None:
        """When the node's step was first held for capacity (the condition's transition)."""
        c = self._condition(name)
        if c is None or c.get("status") != "True":
            return None
        return when(c.get("lastTransitionTime"))

    def set_held(self, name: str, *, reason: str, message: str, now: datetime | None) -> None:
        """`HeldForCapacity`: True with `reason` while held, False (reason `Released`) after;
        its transition time is kept while it stays True (the escalation clock)."""
        old = self._condition(name)
        held = bool(reason)
        was = old is not None and old.get("status") == "True"
        if not held and not was:
            return
        if held and was and old.get("reason") == reason and old.get("message") == message[:1024]:
            return  # unchanged: no write per pass
        stamp = (now or utcnow()).strftime("%Y-%m-%dT%H:%M:%SZ")
        since = old.get("lastTransitionTime") if (old is not None and was == held) else stamp
        cond = {
            "type": CONDITION,
            "status": "True" if held else "False",
            "reason": reason or "Released",
            "message": message[:1024] or "capacity released",
            "lastTransitionTime": since,
            "lastHeartbeatTime": stamp,
        }
        self._write(
            "held_condition",
            lambda t: self.core.patch_node_status(
                name, {"status": {"conditions": [cond]}}, _request_timeout=t
            ),
        )

    def mark(self, pool: ServingPool) -> ScaleMark | None:
        wl = self.workload(pool)
        ann = ((wl or {}).get("metadata") or {}).get("annotations") or {}
        return decode_mark(ann.get(MARK_ANNOTATION))

    # ---- reading --------------------------------------------------------------------

    def _get(self, op: str, ref: Ref, *, scale: bool = False) -> dict[str, Any]:
        """One object as raw JSON; `ref` is (group, version, namespace, plural, name)."""
        self.calls[op] += 1
        call = (
            self.custom.get_namespaced_custom_object_scale
            if scale
            else (self.custom.get_namespaced_custom_object)
        )
        resp = api_call(lambda: call(*ref, _preload_content=False, _request_timeout=self.timeout))
        return json.loads(resp.data)

    def hpa(self, ns: str, name: str) -> tuple[dict[str, Any], str]:
        """The HPA and the autoscaling version it was read with (NotFound propagates)."""
        versions = [self._hpa_version] if self._hpa_version else list(HPA_VERSIONS)
        for v in versions:
            try:
                raw = self._get("get_hpa", _hpa_ref(v, ns, name))
            except NotFound:  # this version is not served, or the HPA is absent
                continue
            self._hpa_version = v
            return raw, v
        raise NotFound(f"horizontalpodautoscaler {ns}/{name} not found")

    def workload(self, pool: ServingPool) -> dict[str, Any] | None:
        if pool.workload is None:
            return None
        return self._get("get_workload", _workload_ref(pool))

    def pods(self, pool: ServingPool, workload: dict[str, Any] | None) -> list[dict[str, Any]]:
        labels = dict(pool.selector)
        if not labels and workload is not None:
            labels = dict(
                ((workload.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            )
        if not labels:
            raise ClusterError(f"serving pool {pool.name}: no selector to find its pods")
        sel = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        return list(
            self._pages(
                "list_pool_pods",
                self.core.list_namespaced_pod,
                namespace=pool.namespace,
                label_selector=sel,
            )
        )

    def demand(
        self,
        pool: ServingPool,
        *,
        now: datetime,
        scale: dict[str, Any] | None,
        hpas: dict[str, dict[str, Any]],
    ) -> tuple[Demand, ...]:
        out: list[Demand] = []
        for s in pool.demand:
            if s.kind == "promql":
                out.append(promql.read(s.prometheus_url, s.query, timeout_s=s.timeout_s))
            elif s.kind == "scale":
                n = ((scale or {}).get("spec") or {}).get("replicas")
                ok = isinstance(n, int)
                out.append(
                    Demand(
                        s.label,
                        n if ok else None,
                        now if ok else None,
                        "" if ok else "no spec.replicas on the Scale subresource",
                    )
                )
            else:
                out.append(hpa_demand(hpas.get(s.name), label=s.label, now=now))
        return tuple(out)

    def spare_gpus(self, nodes: Iterable[dict[str, Any]], *, exclude: str) -> int:
        """GPUs allocatable and not requested on nodes a new replica could land on (no
        cordon, no NoSchedule/NoExecute taint, not the node being repaired), less what
        Pending pods already wait for."""
        free: dict[str, int] = {}
        for n in nodes:
            name = n["metadata"]["name"]
            spec = n.get("spec") or {}
            if name == exclude or spec.get("unschedulable"):
                continue
            if any(t.get("effect") in _BLOCKING for t in spec.get("taints") or []):
                continue
            alloc = ((n.get("status") or {}).get("allocatable") or {}).get(self.gpu_resource)
            try:
                free[name] = int(str(alloc or 0))
            except ValueError:
                continue
        pending = 0
        sel = "status.phase!=Succeeded,status.phase!=Failed"
        for p in self._pages(
            "list_pods", self.core.list_pod_for_all_namespaces, field_selector=sel
        ):
            want = _gpus_requested(p, self.gpu_resource)
            where = (p.get("spec") or {}).get("nodeName")
            if not want:
                continue
            if where in free:
                free[where] -= want
            elif not where:
                pending += want
        return max(0, sum(max(0, v) for v in free.values()) - pending)

    def state(
        self, pool: ServingPool, step: Step, *, now: datetime, nodes: list[dict[str, Any]]
    ) -> PoolState:
        """Everything the gate needs for `pool` and `step`. ClusterErrors propagate: the
        caller holds the step (a pool it cannot read is a pool it cannot protect)."""
        wl = self.workload(pool)
        scale = None
        if pool.workload is not None:
            scale = self._get("get_scale", _workload_ref(pool), scale=True)
        hpas: dict[str, dict[str, Any]] = {}
        for s in pool.demand:
            if s.kind == "hpa" and s.name not in hpas:
                try:
                    hpas[s.name] = self.hpa(pool.namespace, s.name)[0]
                except NotFound:
                    pass  # a missing signal, said by hpa_demand
        node_raw = next((n for n in nodes if n["metadata"]["name"] == step.node), None)
        held_by = _holders_of(node_raw, now) if node_raw is not None else {}
        reps: list[Replica] = []
        for p in self.pods(pool, wl):
            meta = p["metadata"]
            if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            key = f"{meta['namespace']}/{meta['name']}"
            where = (p.get("spec") or {}).get("nodeName") or ""
            gpus = held_by.get(key) if where == step.node else frozenset()
            reps.append(
                Replica(
                    key,
                    where,
                    gpus,
                    ready=_ready(p),
                    terminating=bool(meta.get("deletionTimestamp")),
                )
            )
        caps = [
            int(h["spec"]["maxReplicas"])
            for h in hpas.values()
            if isinstance((h.get("spec") or {}).get("maxReplicas"), int)
        ]
        desired = ((scale or {}).get("spec") or {}).get("replicas")
        if not isinstance(desired, int):
            desired = len(reps)
        ann = ((wl or {}).get("metadata") or {}).get("annotations") or {}
        mark = decode_mark(ann.get(MARK_ANNOTATION))
        demand = self.demand(pool, now=now, scale=scale, hpas=hpas)
        floored = [s.name for s in pool.demand if s.kind == "hpa"][:1]  # the one scale_up raises
        if floored and mark is not None:
            label, hpa = f"hpa/{floored[0]}", hpas.get(floored[0])
            demand = tuple(under_floor(d, hpa, mark) if d.source == label else d for d in demand)
        return PoolState(
            replicas=tuple(reps),
            demand=demand,
            desired=desired,
            max_replicas=min(caps) if caps else None,
            spare_gpus=self.spare_gpus(nodes, exclude=step.node),
            mark=mark,
        )

    # ---- make before break ------------------------------------------------------------

    def _patch(self, op: str, ref: Ref, body: dict[str, Any], *, scale: bool = False) -> None:
        call = (
            self.custom.patch_namespaced_custom_object_scale
            if scale
            else (self.custom.patch_namespaced_custom_object)
        )
        self._write(
            op,
            lambda t: call(*ref, body, _preload_content=False, _request_timeout=t),
        )

    def scale_up(
        self, pool: ServingPool, *, to: int, added: int, node: str, state: PoolState, now: datetime
    ) -> ScaleMark:
        """Mark first (a crash after it leaves a mark that times out and is restored, never
        an unexplained scale), then the HPA floor, then the replicas."""
        assert pool.workload is not None
        ns = pool.namespace
        hpa_names = [s.name for s in pool.demand if s.kind == "hpa"]
        hpa = self.hpa(ns, hpa_names[0]) if hpa_names else None
        old_min = ((hpa[0].get("spec") or {}).get("minReplicas") or 1) if hpa else None
        seen = ((hpa[0].get("status") or {}).get("desiredReplicas")) if hpa else None
        mark = ScaleMark(node, added, state.desired, now, old_min,
                         seen if isinstance(seen, int) else None)  # fmt: skip
        body = {"metadata": {"annotations": {MARK_ANNOTATION: encode_mark(mark)}}}
        self._patch("serving_mark", _workload_ref(pool), body)
        if hpa is not None and old_min is not None and old_min < to:
            ref = _hpa_ref(hpa[1], ns, hpa_names[0])
            self._patch("hpa_min", ref, {"spec": {"minReplicas": to}})
        self._patch("scale", _workload_ref(pool), {"spec": {"replicas": to}}, scale=True)
        return mark

    def restore(self, pool: ServingPool, state: PoolState) -> int:
        """Replicas back (no lower than what the owner asked for since, less ours), the HPA
        floor back, then the mark removed. Returns the replicas set."""
        mark = state.mark
        assert mark is not None and pool.workload is not None
        ns = pool.namespace
        to = max(mark.original, state.desired - mark.added)
        hpa_names = [s.name for s in pool.demand if s.kind == "hpa"]
        if hpa_names and mark.original_min is not None:
            _, version = self.hpa(ns, hpa_names[0])
            ref = _hpa_ref(version, ns, hpa_names[0])
            self._patch("hpa_min", ref, {"spec": {"minReplicas": mark.original_min}})
        self._patch("scale", _workload_ref(pool), {"spec": {"replicas": to}}, scale=True)
        body = {"metadata": {"annotations": {MARK_ANNOTATION: None}}}
        self._patch("serving_mark", _workload_ref(pool), body)
        return to


def _hpa_ref(version: str, ns: str, name: str) -> Ref:
    return ("autoscaling", version, ns, "horizontalpodautoscalers", name)


def _workload_ref(pool: ServingPool) -> Ref:
    assert pool.workload is not None
    w = pool.workload
    return ("apps", "v1", pool.namespace, PLURALS[w.kind], w.name)


def hpa_demand(hpa: dict[str, Any] | None, *, label: str, now: datetime) -> Demand:
    """`status.desiredReplicas`, believed only while the HPA says it can compute it."""
    if hpa is None:
        return Demand(label, None, None, "HorizontalPodAutoscaler not found")
    status = hpa.get("status") or {}
    # desiredReplicas is never omitted (0 before the HPA controller first ran), so only a
    # ScalingActive=True condition says the number was computed from live metrics.
    active = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "ScalingActive"), None
    )
    if active is None:
        return Demand(label, None, None, "never computed (no ScalingActive condition)")
    if active.get("status") != "True":
        return Demand(
            label, None, None, f"ScalingActive={active.get('status')} ({active.get('reason', '')})"
        )
    gen, seen = (hpa.get("metadata") or {}).get("generation"), status.get("observedGeneration")
    if isinstance(gen, int) and isinstance(seen, int) and seen < gen:
        return Demand(label, None, None, "status older than the spec (observedGeneration)")
    n = status.get("desiredReplicas")
    if not isinstance(n, int):
        return Demand(label, None, None, "no status.desiredReplicas")
    return Demand(label, n, now)


def under_floor(reading: Demand, hpa: dict[str, Any] | None, mark: ScaleMark) -> Demand:
    """The HPA's demand while make-before-break holds its `minReplicas` up. The HPA
    clamps `desiredReplicas` to `minReplicas`, so at our floor it reads the floor: demand
    we made, which would keep the step waiting for itself and the restore from ever
    coming. There the HPA's own demand is hidden (at most the floor): the reading is the
    one it gave before we raised the floor. Above the floor it is the HPA's again."""
    if reading.replicas is None or hpa is None or mark.original_min is None:
        return reading
    floor = (hpa.get("spec") or {}).get("minReplicas")
    if not isinstance(floor, int) or floor <= mark.original_min or reading.replicas > floor:
        return reading
    if mark.hpa_desired is None:  # a mark written before this was recorded
        return Demand(reading.source, None, None, "desiredReplicas held at our minReplicas")
    return Demand(reading.source, max(mark.hpa_desired, mark.original_min), reading.at)


def _holders_of(node: dict[str, Any], now: datetime) -> dict[str, frozenset[str]]:
    """pod key -> the GPU UUIDs it holds, from the agent's fresh, complete mapping; a pod
    not in it is unknown (the gate then counts it as removed by any step on the node)."""
    meta = node.get("metadata") or {}
    msg, _ = holders_wire.decode(
        (meta.get("annotations") or {}).get(holders_wire.HOLDERS_ANNOTATION)
    )
    if msg is None or not msg.complete:
        return {}
    if (now - msg.read_at).total_seconds() > holders_wire.MAX_AGE_S:
        return {}
    out: dict[str, set[str]] = {}
    for gpu, pods in msg.holders.items():
        for p in pods:
            out.setdefault(p, set()).add(gpu)
    return {k: frozenset(v) for k, v in out.items()}
