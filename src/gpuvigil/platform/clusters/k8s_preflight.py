"""Preflight on Kubernetes: one pod per validation that runs to completion, created by the
controller; its result is the pod's own exit, which only the node's kubelet can write.

Called by `clusters.kubernetes` (`revalidate` starts a run, `list_nodes`/`get_node` read the
results). Why a pod the controller creates, not a DaemonSet: a DaemonSet's pod never ends,
so the GPUs it asks for stay reserved for the pod's life and no workload can get every GPU
of the node; and a result written by the preflight pod onto the Node could be written by
any other node's pod with the same account. Here the preflight account needs no API
permission at all: the pod exits 0 (pass), 1 (a problem) or 2 (could not run), and writes
its summary to the termination log, both recorded in the pod's status by the kubelet of the
node it ran on. The API server lets a kubelet write the status of its own node's pods only
(NodeRestriction), and only the controller may create pods in its namespace.

The pod comes from the PodTemplate `preflight_template` in `preflight_namespace`
(deploy/kubernetes/preflight/podtemplate.yaml: image, runtimeClassName, /dev/kmsg,
privileges, tolerations for site taints): the controller pins it to the node (required node
affinity on the node's name, so the scheduler still does the GPU accounting), asks for every
GPU the node should have and passes the count as `--expect-gpus`. A finished pod holds no
resources: after its run a workload can get every GPU of the node. The previous run's pod is
deleted when the next one starts.

The count never comes from the Node's status (`allocatable`, `capacity`): before 1.30 any
node's agent account can rewrite it, and a count of 0 makes a validation that checks
nothing. It is the pool's (`pool_gpus`, controller config), else the instance-type
catalog's for the node's instance-type label (`expected_gpus`). With neither the controller
does not validate: the node gets a failed result that says why, at once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from gpuvigil.core import wire
from gpuvigil.core.findings import utcnow
from gpuvigil.node.catalog.instances import InstanceCatalog, load_catalog
from gpuvigil.platform.clusters.base import Conflict, NotFound, Preflight
from gpuvigil.platform.clusters.k8s_api import api_call, json_object, when
from gpuvigil.platform.state import POOL_LABEL, pool_of_labels

log = logging.getLogger("gpuvigil.clusters.kubernetes")
APP_LABEL = "app.kubernetes.io/name"
APP = "gpuvigil-preflight"
NODE_LABEL = "gpuvigil.io/node"
SINCE_ANNOTATION = "gpuvigil.io/validation-since"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def label_value(node: str) -> str:
    """A node name as a label value (at most 63 characters; long names are hashed)."""
    if len(node) <= 63:
        return node
    return node[:50] + "-" + hashlib.sha256(node.encode()).hexdigest()[:12]


def pod_name(node: str, since: datetime) -> str:
    """One name per (node, validation): creating it twice is a harmless 409."""
    digest = hashlib.sha256(f"{node}\0{since.isoformat()}".encode()).hexdigest()[:10]
    return f"{APP}-{node[:200]}-{digest}".lower()


def expected_gpus(
    labels: dict[str, str],
    *,
    pool_gpus: dict[str, int],
    pool_label: str,
    instance_type_label: str,
    catalog: InstanceCatalog,
) -> tuple[int | None, str]:
    """(GPUs the validation expects, where that comes from), or (None, why not) (pure).

    The pool's count (controller config) first; else the catalog's count for the node's
    instance type, when it has GPUs (a GPU node relabelled as a CPU type must not validate
    with 0). Labels are read only to pick a pool or a catalog entry: see docs/security.md
    for who can write them."""
    pool = pool_of_labels(labels, label=pool_label)
    if pool in pool_gpus:
        return pool_gpus[pool], f"pool {pool} (controller.kubernetes.pool_gpus)"
    kind = labels.get(instance_type_label) or ""
    entry = catalog.lookup(kind)
    if entry is not None and entry[1].gpus > 0:
        return entry[1].gpus, f"instance type {entry[0]} (catalog)"
    if entry is not None:
        why = f"the catalog gives instance type {entry[0]} no GPUs"
    elif kind:
        why = f"instance type {kind!r} is not in the catalog"
    else:
        why = f"no {instance_type_label} label"
    return None, (
        f"not validated: no GPU count for pool {pool} (controller.kubernetes.pool_gpus) "
        f"and {why}; the count never comes from the node's own status"
    )


def build_pod(
    template: dict[str, Any], *, node: str, since: datetime, gpus: int, gpu_resource: str
) -> dict[str, Any]:
    """The pod for one validation of `node`, from the PodTemplate's `template` (pure)."""
    tmpl = copy.deepcopy(template.get("template") or {})
    meta = tmpl.get("metadata") or {}
    spec = tmpl.get("spec") or {}
    labels = {**(meta.get("labels") or {}), APP_LABEL: APP, NODE_LABEL: label_value(node)}
    annotations = {**(meta.get("annotations") or {}), SINCE_ANNOTATION: since.isoformat()}
    spec["restartPolicy"] = "Never"
    spec.pop("nodeName", None)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    affinity = spec.setdefault("affinity", {})
    affinity["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
    }
    tolerations = spec.setdefault("tolerations", [])
    for key in (wire.UNHEALTHY_TAINT, wire.UNVALIDATED_TAINT):  # the node is blocked by us
        if not any(t.get("key") == key for t in tolerations):
            tolerations.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
    containers = spec.get("containers") or []
    if containers:
        main = containers[0]
        res = main.setdefault("resources", {})
        for part in ("limits", "requests"):
            values = res.setdefault(part, {})
            if gpus > 0:
                values[gpu_resource] = str(gpus)
            else:
                values.pop(gpu_resource, None)
        main["args"] = [*(main.get("args") or []), "--expect-gpus", str(gpus)]
        main.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(node, since),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def result_of(pod: dict[str, Any], *, node: str) -> Preflight | None:
    """A finished preflight pod's verdict for `node`; None while it runs or when the pod is
    not one the controller can trust for that node (wrong node, a mirror pod)."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") != node or MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return None
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    term: dict[str, Any] = {}
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        break
    at = when(term.get("finishedAt")) or when(status.get("startTime")) or utcnow()
    # The kubelet's times have whole seconds; the run belongs to the validation it was
    # started for (the controller wrote that on the pod), so it is never older than it.
    started_for = when((meta.get("annotations") or {}).get(SINCE_ANNOTATION))
    if started_for is not None and started_for > at:
        at = started_for
    message = str(term.get("message") or "")
    parsed = json_object(message.strip().splitlines()[-1] if message.strip() else None)
    if parsed and isinstance(parsed.get("summary"), str):
        summary = parsed["summary"]
    elif phase == "Failed":
        code = term.get("exitCode")
        why = status.get("reason") or term.get("reason") or ""
        summary = f"exit {code}" if code is not None else why or "pod failed"
        if message:
            summary += f": {message.strip()[-300:]}"
    else:
        summary = "all checks passed"
    return Preflight(phase == "Succeeded", at, summary[:500], for_since=started_for)


class PreflightPods:
    """Starts preflight runs and reads their results (see the module docstring)."""

    def __init__(
        self,
        core: Any,
        settings: Any,  # KubernetesSettings
        calls: Any,
        pages: Callable[..., Iterator[dict[str, Any]]],
        *,
        write: Callable[..., Any],
        pool_label: str = POOL_LABEL,
    ) -> None:
        self.core, self.settings, self.calls, self._pages = core, settings, calls, pages
        self._write = write  # the adapter's: fenced (clusters.base), counted, timed
        self.timeout = settings.request_timeout_s
        self.pool_label = pool_label
        self.catalog = load_catalog()
        # Validations refused for want of a GPU count: a failed result each, at once
        self.refused: dict[str, Preflight] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.settings.preflight_template)

    def results(self) -> dict[str, Preflight]:
        """The newest finished run per node (one paged list of the namespace's runs)."""
        if not self.enabled:
            return {}
        ns = self.settings.preflight_namespace
        out: dict[str, Preflight] = {}
        for pod in self._pages(
            "list_preflight_pods",
            lambda **kw: self.core.list_namespaced_pod(ns, **kw),
            label_selector=f"{APP_LABEL}={APP}",
        ):
            node = (pod.get("spec") or {}).get("nodeName")
            res = result_of(pod, node=node) if node else None
            if res is not None and (node not in out or res.at > out[node].at):
                out[node] = res
        for node, res in self.refused.items():
            if node not in out or res.at > out[node].at:
                out[node] = res
        return out

    def start(self, node: str, *, since: datetime) -> int:
        """Create this validation's run unless it exists; delete the node's older runs."""
        if not self.enabled:
            return 0
        ns = self.settings.preflight_namespace
        name = pod_name(node, since)
        for old in self._pages(
            "list_preflight_pods",
            lambda **kw: self.core.list_namespaced_pod(ns, **kw),
            label_selector=f"{APP_LABEL}={APP},{NODE_LABEL}={label_value(node)}",
        ):
            old_name = (old.get("metadata") or {}).get("name")
            if old_name and old_name != name:
                self._delete(old_name)
        self.calls["get_preflight_template"] += 1
        try:
            template = json.loads(
                api_call(
                    lambda: self.core.read_namespaced_pod_template(
                        self.settings.preflight_template,
                        ns,
                        _preload_content=False,
                        _request_timeout=self.timeout,
                    )
                ).data
            )
        except NotFound:
            log.warning(
                "no PodTemplate %s/%s: preflight cannot run on %s (the node waits for "
                "validation_timeout_s); kubectl apply -k deploy/kubernetes/preflight",
                ns,
                self.settings.preflight_template,
                node,
            )
            return 0
        raw = json.loads(
            api_call(
                lambda: self.core.read_node(
                    node, _preload_content=False, _request_timeout=self.timeout
                )
            ).data
        )
        gpus, source = expected_gpus(
            (raw.get("metadata") or {}).get("labels") or {},
            pool_gpus=self.settings.pool_gpus,
            pool_label=self.pool_label,
            instance_type_label=self.settings.instance_type_label,
            catalog=self.catalog,
        )
        if gpus is None:
            log.warning("%s: %s", node, source)
            self.refused[node] = Preflight(
                False, max(utcnow(), since), source[:500], for_since=since
            )
            return 0
        self.refused.pop(node, None)
        log.info("%s: preflight expects %d GPUs, from %s", node, gpus, source)
        body = build_pod(
            template, node=node, since=since, gpus=gpus, gpu_resource=self.settings.gpu_resource
        )
        try:
            self._write(
                "create_preflight_pod",
                lambda t: self.core.create_namespaced_pod(ns, body, _request_timeout=t),
            )
        except Conflict:
            return 0  # this validation's run exists already
        return 1

    def _delete(self, name: str) -> None:
        try:
            self._write(
                "delete_preflight_pod",
                lambda t: self.core.delete_namespaced_pod(
                    name, self.settings.preflight_namespace, _request_timeout=t
                ),
            )
        except NotFound:
            pass  # gone already
