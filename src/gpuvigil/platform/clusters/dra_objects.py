"""The DRA objects of per-GPU isolation, pure: which device a GPU is, which path it takes,
the DeviceTaintRule for it, the pods ResourceClaims reserve it for.

Used by `clusters.k8s_dra` (the API side, whose docstring tells the path rules) and its
tests; never raises on what the API server returned, whatever its shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from gpuvigil.core.wire import DOMAIN

GROUP = "resource.k8s.io"
DRIVER = "gpu.nvidia.com"  # the NVIDIA DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu)
TAINT_KEY = f"{DOMAIN}/gpu-isolated"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuvigil"}
# Most stable first: a cluster serving several versions is written in its best one.
VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
Path = Literal["dra", "device-plugin", "node"]
Effect = Literal["None", "NoSchedule"]


@dataclass(frozen=True)
class Device:
    """One DRA device: what a DeviceTaintRule selects."""

    driver: str
    pool: str
    device: str
    uuid: str = ""

    @property
    def resource_id(self) -> str:
        """Its id in a pod's `allocatedResourcesStatus` (`clusters.gpu_holders`, dra_device)."""
        return f"{self.driver}/{self.pool}/{self.device}"


def parse_device(resource_id: str, *, uuid: str = "") -> Device | None:
    """Pure: `Device.resource_id` back to the device (None for garbage). The driver is a
    DNS subdomain and the device a DNS label (neither has a "/"); the pool may have some."""
    driver, _, rest = resource_id.partition("/")
    pool, _, device = rest.rpartition("/")
    if not (driver and pool and device) or len(resource_id) > 600:
        return None
    return Device(driver, pool, device, uuid)


def ours(rule: Mapping[str, Any] | None) -> bool:
    """A stored DeviceTaintRule carries our managed-by label."""
    meta = rule.get("metadata") if isinstance(rule, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    key = "app.kubernetes.io/managed-by"
    return isinstance(labels, Mapping) and labels.get(key) == MANAGED_BY[key]


def enforces(rule: Mapping[str, Any] | None, device: Device) -> bool:
    """Pure: `rule` is ours, selects exactly `device`, and keeps new work off it (NoSchedule)."""
    if not ours(rule):
        return False
    assert rule is not None
    spec = rule.get("spec") if isinstance(rule.get("spec"), Mapping) else {}
    sel = spec.get("deviceSelector") if isinstance(spec.get("deviceSelector"), Mapping) else {}
    taint = spec.get("taint") if isinstance(spec.get("taint"), Mapping) else {}
    return (
        (sel.get("driver"), sel.get("pool"), sel.get("device"))
        == (device.driver, device.pool, device.device)
        and taint.get("key") == TAINT_KEY
        and taint.get("effect") == "NoSchedule"
    )


@dataclass(frozen=True)
class Served:
    """What `resource.k8s.io` serves: the version to write DeviceTaintRules in and to read
    ResourceSlices and ResourceClaims in (None: not served)."""

    taint_rules: str | None = None
    slices: str | None = None
    claims: str | None = None


@dataclass(frozen=True)
class Choice:
    path: Path
    why: str
    device: Device | None = None  # set for `dra`
    version: str | None = None  # of DeviceTaintRule, for `dra`


def choose_path(served: Served, device: Device | None, *, plugin_agrees: bool) -> Choice:
    """Pure: DRA when the rule can be written for a device we found; else the device
    plugin when it already keeps work off the GPU; else the whole node."""
    if served.taint_rules is not None and device is not None:
        return Choice(
            "dra",
            f"DeviceTaintRule served ({GROUP}/{served.taint_rules}); "
            f"the GPU is {device.resource_id}",
            device,
            served.taint_rules,
        )
    if plugin_agrees:
        return Choice("device-plugin", "the device plugin took the GPU out of allocatable")
    if served.taint_rules is None:
        why = "no DeviceTaintRule served, and allocatable still counts the GPU"
    else:
        why = "no ResourceSlice here publishes the GPU, and allocatable still counts it"
    return Choice("node", why)


def device_of(
    slices: Iterable[Mapping[str, Any]], *, node: str, gpu_uuid: str, driver: str = DRIVER
) -> Device | None:
    """Pure: the device of `driver` on `node` whose `uuid` attribute is `gpu_uuid`. Reads
    every served shape: `devices[].attributes` (v1, v1beta2) and `devices[].basic.attributes`
    (v1beta1, v1alpha3); the attribute may be qualified with the driver's domain."""
    for rs in slices:
        spec = rs.get("spec") if isinstance(rs, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("driver") != driver:
            continue
        pool = spec.get("pool")
        pool_name = pool.get("name") if isinstance(pool, Mapping) else None
        devices = spec.get("devices")
        if spec.get("nodeName") != node or not isinstance(pool_name, str):
            continue
        for dev in devices if isinstance(devices, list) else ():
            name = dev.get("name") if isinstance(dev, Mapping) else None
            if not isinstance(name, str):
                continue
            basic = dev.get("basic") if isinstance(dev.get("basic"), Mapping) else dev
            attrs = basic.get("attributes")
            if not isinstance(attrs, Mapping):
                continue
            for key in ("uuid", f"{driver}/uuid"):
                value = attrs.get(key)
                if isinstance(value, Mapping) and value.get("string") == gpu_uuid:
                    return Device(driver, pool_name, name, gpu_uuid)
    return None


def rule_name(device: Device) -> str:
    """A DNS subdomain unique to the device: readable prefix, hash of the full identity."""
    digest = hashlib.sha256(device.resource_id.encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9-]+", "-", f"{device.pool}-{device.device}".lower()).strip("-")
    return f"gpuvigil-{slug[:200]}-{digest}"


def taint_value(reason: str) -> str:
    """`reason` as a label value (what the taint's `value` must be): 63 characters of
    [A-Za-z0-9-_.], alphanumeric at both ends."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", text)


def rule_body(
    device: Device, *, version: str, reason: str, effect: Effect, now: datetime
) -> dict[str, Any]:
    """Pure: the DeviceTaintRule for `device`. Refuses NoExecute (it deletes pods past
    their PodDisruptionBudgets): the controller evicts the holders itself."""
    if effect not in ("None", "NoSchedule"):
        raise ValueError(f"effect {effect!r}: gpuvigil writes only None or NoSchedule")
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name(device), "labels": dict(MANAGED_BY)},
        "spec": {
            "deviceSelector": {
                "driver": device.driver,
                "pool": device.pool,
                "device": device.device,
            },
            "taint": {
                "key": TAINT_KEY,
                "value": taint_value(reason),
                "effect": effect,
                "timeAdded": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        },
    }


def claim_pods(claims: Iterable[Mapping[str, Any]], device: Device) -> list[str]:
    """Pure: "ns/pod" of every pod a ResourceClaim allocated with `device` is reserved for."""
    out: set[str] = set()
    for claim in claims:
        if not isinstance(claim, Mapping):
            continue
        meta = claim.get("metadata") if isinstance(claim.get("metadata"), Mapping) else {}
        status = claim.get("status") if isinstance(claim.get("status"), Mapping) else {}
        alloc = status.get("allocation") if isinstance(status.get("allocation"), Mapping) else {}
        devices = alloc.get("devices") if isinstance(alloc.get("devices"), Mapping) else {}
        results = devices.get("results")
        if not isinstance(results, list) or not any(
            isinstance(r, Mapping)
            and (r.get("driver"), r.get("pool"), r.get("device"))
            == (device.driver, device.pool, device.device)
            for r in results
        ):
            continue
        for ref in status.get("reservedFor") or ():
            if isinstance(ref, Mapping) and ref.get("resource") == "pods" and ref.get("name"):
                out.add(f"{meta.get('namespace') or 'default'}/{ref['name']}")
    return sorted(out)
