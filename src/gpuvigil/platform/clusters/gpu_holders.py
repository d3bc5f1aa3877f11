"""Which pods hold one GPU of a Kubernetes node: pure, read from objects the caller has.

Called by the controller's per-GPU path (`platform.isolation`) before it evicts a bad GPU's
holders. `read(node, gpu_uuid, now, pods=...).listed()` answers `["ns/pod", ...]` (possibly
empty: nobody holds it), or None when that cannot be known; then the caller falls back to
the whole node, never to "no holders". The `Holders` it returns also says its source and why.

Two sources, per pod, the first that speaks for it:
1. `pod.status.containerStatuses[].allocatedResourcesStatus` (KEP-4680 ResourceHealthStatus:
   alpha 1.31, beta and on by default 1.36): `[{name: "nvidia.com/gpu", resources:
   [{resourceID: "GPU-<uuid>", health}]}]`; for DRA, `name` is `claim:<claim>/<request>` and
   `resourceID` is `<driver>/<pool>/<device>` (pass `dra_device=` to match one). The kubelet
   writes it for the pod itself, so it is never stale for that pod.
2. The agent's `core.holders` annotation on the Node, read from the kubelet's PodResources
   API; usable only while fresh (`core.freshness.judge`, `max_age_s`), without error and
   with every device placed on a GPU.

Without `pods`, only the annotation answers. With `pods` (the pods bound to this node),
a pod that asks for an NVIDIA resource, is not finished, and neither source places is
unknown, and so is the answer: it may hold the GPU (admitted after the agent's last read).
Holders named by the annotation that are no longer among `pods` have gone and are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuvigil.core import holders as wire
from gpuvigil.core.freshness import judge

DRA_NAME_PREFIX = "claim:"
_DONE = ("Succeeded", "Failed")  # a finished pod's devices are free again


@dataclass(frozen=True)
class Holders:
    pods: tuple[str, ...] | None  # None: unknown, fall back to the whole node
    source: str  # "status", "annotation", "status+annotation", or "" when unknown
    why: str = ""  # for unknown: what was missing; for the record otherwise

    def listed(self) -> list[str] | None:
        """The holders ("ns/name", sorted), or None when unknown."""
        return None if self.pods is None else list(self.pods)


def read(
    node: Mapping[str, Any],
    gpu_uuid: str,
    now: datetime,
    *,
    pods: Iterable[Mapping[str, Any]] | None = None,
    max_age_s: float = wire.MAX_AGE_S,
    dra_device: str | None = None,
) -> Holders:
    mapping, why = _mapping(node, now=now, max_age_s=max_age_s)
    if pods is None:
        if mapping is None:
            return Holders(None, "", why)
        return Holders(tuple(sorted(set(mapping.holders.get(gpu_uuid, ())))), "annotation")
    node_name = _get(node, "metadata", "name")
    placed = _placed(mapping) if mapping is not None else set()
    found: set[str] = set()
    used: set[str] = set()
    for pod in pods:
        if not isinstance(pod, Mapping):
            return Holders(None, "", "a pod that is not an object")
        if node_name and _get(pod, "spec", "nodeName") not in (None, node_name):
            continue  # the caller's list was wider than this node
        if _get(pod, "status", "phase") in _DONE:
            continue
        key = _key(pod)
        ids = _status_ids(pod)
        if ids is not None:
            used.add("status")
            if any(_names(i, gpu_uuid, dra_device) for i in ids):
                found.add(key)
            continue
        if not _asks_for_gpus(pod):
            continue
        if mapping is None:
            return Holders(None, "", f"{key} asks for GPUs; {why}")
        if key not in placed:
            return Holders(
                None,
                "",
                f"{key} asks for GPUs but the mapping read at "
                f"{mapping.read_at.isoformat()} does not place it",
            )
        used.add("annotation")
        if key in mapping.holders.get(gpu_uuid, ()):
            found.add(key)
    return Holders(tuple(sorted(found)), "+".join(sorted(used, reverse=True)) or "none")


def _mapping(
    node: Mapping[str, Any], *, now: datetime, max_age_s: float
) -> tuple[wire.GpuHolders | None, str]:
    annotations = _get(node, "metadata", "annotations")
    text = annotations.get(wire.HOLDERS_ANNOTATION) if isinstance(annotations, Mapping) else None
    message, why = wire.decode(text if isinstance(text, str) else None)
    if message is None:
        return None, why
    if message.error:
        return None, f"the agent could not read its pods' devices: {message.error}"
    if message.unmapped:
        return None, f"devices not placed on a GPU: {', '.join(message.unmapped[:5])}"
    age = judge(message.read_at, now=now, max_age_s=max_age_s)
    if not age.fresh:
        return None, f"gpu-holders annotation {age.describe()}"
    return message, ""


def _placed(mapping: wire.GpuHolders) -> set[str]:
    return {key for keys in mapping.holders.values() for key in keys}


def _status_ids(pod: Mapping[str, Any]) -> list[str] | None:
    """The resource ids the kubelet reports this pod holds, or None when it reports none
    of ours (the gate is off, or the kubelet predates it)."""
    ids: list[str] | None = None
    for field in ("initContainerStatuses", "containerStatuses"):
        statuses = _get(pod, "status", field)
        for status in statuses if isinstance(statuses, list) else ():
            entries = (
                status.get("allocatedResourcesStatus") if isinstance(status, Mapping) else None
            )
            for entry in entries if isinstance(entries, list) else ():
                name = entry.get("name") if isinstance(entry, Mapping) else None
                if not isinstance(name, str) or not (
                    name.startswith(wire.RESOURCE_PREFIX) or name.startswith(DRA_NAME_PREFIX)
                ):
                    continue
                ids = ids if ids is not None else []
                resources = entry.get("resources")
                for res in resources if isinstance(resources, list) else ():
                    rid = res.get("resourceID") if isinstance(res, Mapping) else None
                    if isinstance(rid, str):
                        ids.append(rid)
    return ids


def _names(resource_id: str, gpu_uuid: str, dra_device: str | None) -> bool:
    return wire.gpu_of_device(resource_id) == gpu_uuid or (
        dra_device is not None and resource_id == dra_device
    )


def _asks_for_gpus(pod: Mapping[str, Any]) -> bool:
    """Does any container ask for an NVIDIA extended resource (limits; requests equal them)?"""
    for field in ("initContainers", "containers"):
        containers = _get(pod, "spec", field)
        for c in containers if isinstance(containers, list) else ():
            resources = c.get("resources") if isinstance(c, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for kind in ("limits", "requests"):
                amounts = resources.get(kind)
                for name, amount in amounts.items() if isinstance(amounts, Mapping) else ():
                    if str(name).startswith(wire.RESOURCE_PREFIX) and str(amount).strip() not in (
                        "0",
                        "",
                    ):
                        return True
    return False


def _key(pod: Mapping[str, Any]) -> str:
    return f"{_get(pod, 'metadata', 'namespace') or 'default'}/{_get(pod, 'metadata', 'name')}"


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj
