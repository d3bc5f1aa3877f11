"""Draining a Kubernetes node: the Eviction API (PodDisruptionBudgets honoured), both
policy/v1 and policy/v1beta1, the DisruptionTarget pod condition, and removal of what is
left at the deadline. Used by `clusters.kubernetes.KubernetesCluster.drain`.

The condition is set *before* the eviction (as Kubernetes' own eviction does from 1.26): an
evicted pod may be gone before a later write lands (a grace period of 0, a kubelet that is
quick), and a Job's podFailurePolicy must see it on the pod's last state. An eviction a
PodDisruptionBudget refuses turns it back to False: that pod was not disrupted. Past the
deadline a pod is still evicted first; only one a budget refuses is deleted, and the drain's
status names it (`DrainStatus.past_budget`: an Event, a metric and an event-log line,
`platform.serving_hook`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from gpuvigil.core.findings import utcnow
from gpuvigil.platform.clusters.base import (
    ClusterError,
    DrainStatus,
    Fenced,
    Forbidden,
    Unavailable,
)
from gpuvigil.platform.clusters.k8s_api import map_error
from gpuvigil.platform.clusters.settings import KubernetesSettings

log = logging.getLogger("gpuvigil.clusters.kubernetes")
DISRUPTION_REASON = "NodeFaultByGpuvigil"


def workload(pod: dict[str, Any]) -> bool:
    """Pods a drain moves: not DaemonSet-owned, not mirror (static) pods, not finished."""
    meta = pod.get("metadata", {})
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")


class Drainer:
    """Evicts a node's workload pods; remembers which Eviction version the server serves."""

    def __init__(
        self,
        core: Any,
        settings: KubernetesSettings,
        calls: Counter[str],
        pages: Callable[..., Iterator[dict[str, Any]]],
        *,
        write: Callable[..., Any],
        fence: Callable[[], float],
    ) -> None:
        self.core, self.settings, self.calls, self._pages = core, settings, calls, pages
        self._write, self._fence = write, fence  # every write is fenced (clusters.base)
        self.timeout = settings.request_timeout_s
        self._eviction_version: str | None = None  # learnt on first use: policy/v1 or v1beta1

    def drain(
        self, name: str, *, deadline: datetime, reason: str, grace_s: int | None = None
    ) -> DrainStatus:
        """`grace_s`: each pod's termination grace period (None: the pod's own)."""
        sel = f"spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed"
        pods = [
            p
            for p in self._pages(
                "list_pods", self.core.list_pod_for_all_namespaces, field_selector=sel
            )
            if workload(p)
        ]
        past = utcnow() >= deadline
        blocked = forced = 0
        past_budget: list[str] = []
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue  # already going; still counted as remaining
            got = self._move(meta["namespace"], meta["name"], past=past, reason=reason,
                             grace_s=grace_s)  # fmt: skip
            blocked += got == "blocked"
            if got == "forced":
                forced += 1
                past_budget.append(f"{meta['namespace']}/{meta['name']}")
        left = sum(
            1
            for p in self._pages(
                "list_pods", self.core.list_pod_for_all_namespaces, field_selector=sel
            )
            if workload(p)
        )
        return DrainStatus(
            remaining=left, blocked=blocked, forced=forced, past_budget=tuple(past_budget)
        )

    def evict_pods(
        self, pods: list[str], *, deadline: datetime, reason: str, grace_s: int | None = None
    ) -> DrainStatus:
        """Move the named pods ("ns/name") as `drain` moves a node's: the holders of one
        GPU (`platform.isolation`), so nothing else on the node is touched. `remaining`
        counts the ones a disruption budget kept (the caller asks who holds the GPU again:
        a Terminating pod still holds it)."""
        past = utcnow() >= deadline
        blocked = forced = 0
        past_budget: list[str] = []
        for key in pods:
            ns, _, pname = key.partition("/")
            if ns and pname:
                got = self._move(ns, pname, past=past, reason=reason, grace_s=grace_s)
                blocked += got == "blocked"
                if got == "forced":
                    forced += 1
                    past_budget.append(key)
        return DrainStatus(
            remaining=blocked, blocked=blocked, forced=forced, past_budget=tuple(past_budget)
        )

    def _move(self, ns: str, pname: str, *, past: bool, reason: str, grace_s: int | None) -> str:
        """Evict one pod, even past the deadline (a drain held for capacity may start
        late): "evicted", "blocked" (a disruption budget refused, before the deadline) or
        "forced" (past it, a budget refused and the pod was deleted: the caller names it)."""
        self._mark(ns, pname, reason if not past else f"{reason} (deadline passed)")
        if self._evict(ns, pname, grace_s):
            return "evicted"
        if not past:
            self._mark(ns, pname, f"eviction refused: {reason}", disrupted=False)
            return "blocked"
        try:
            self._write(
                "delete_pod",
                lambda t: self.core.delete_namespaced_pod(
                    pname, ns, grace_period_seconds=grace_s, _request_timeout=t
                ),
            )
        except Forbidden:
            return "evicted"  # gone already
        return "forced"

    def _evict(self, ns: str, pod: str, grace_s: int | None) -> bool:
        """True when evicted (or already gone); False when a disruption budget refused."""
        versions = (
            [self._eviction_version] if self._eviction_version else ["policy/v1", "policy/v1beta1"]
        )
        for version in versions:
            body: dict[str, Any] = {
                "apiVersion": version,
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": ns},
            }
            if grace_s is not None:
                body["deleteOptions"] = {"gracePeriodSeconds": grace_s}
            left = self._fence()
            self.calls["evict"] += 1
            try:
                self.core.create_namespaced_pod_eviction(
                    pod, ns, body, _request_timeout=min(self.timeout, max(0.1, left))
                )
                self._eviction_version = version
                return True
            except ApiException as e:
                if e.status == 429:  # a PodDisruptionBudget says not now
                    self._eviction_version = version
                    return False
                if e.status in (400, 404) and version != versions[-1]:
                    continue  # the server may not serve this version: try the next one
                if e.status == 404:
                    return True  # the pod is gone
                raise map_error(e) from e
            except (urllib3.exceptions.HTTPError, OSError) as e:
                raise Unavailable(f"eviction of {ns}/{pod}: {e}") from e
        return False

    def _mark(self, ns: str, pod: str, message: str, *, disrupted: bool = True) -> None:
        """The DisruptionTarget condition: a Job's podFailurePolicy can ignore this failure."""
        cond = {
            "type": "DisruptionTarget",
            "status": "True" if disrupted else "False",
            "reason": DISRUPTION_REASON if disrupted else "EvictionRefused",
            "message": message[:512],
            "lastTransitionTime": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        try:
            self._write(
                "mark_pod",
                lambda t: self.core.patch_namespaced_pod_status(
                    pod, ns, {"status": {"conditions": [cond]}}, _request_timeout=t
                ),
            )
        except Fenced:
            raise
        except ClusterError as e:  # gone already, or no permission: the eviction stands
            log.info("could not mark %s/%s as DisruptionTarget: %s", ns, pod, e)
