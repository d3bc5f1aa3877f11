"""Per-GPU isolation with DRA: a `DeviceTaintRule` for one GPU, and which path a GPU takes.

Called by the controller's per-GPU path (`platform.gpu_path`) through the Kubernetes
adapter (`KubernetesCluster.gpu_enforcement`, `enforce_gpu`, `release_gpu`):

    taints = DeviceTaints(api_client, write=cluster._write)   # fenced writes
    way = taints.enforcement("gpu-1", "GPU-...", plugin_agrees=..., device=None)
    if way is not None:                       # the dra path; way.holders from the claims
        why = taints.isolate(way.device, gpu_uuid="GPU-...", reason="XID_79")
        # None (dry run), then NoSchedule, read back; why != "": the whole node instead
    ...
    taints.release_device(way.device)   # repaired, revalidated or given back: rule deleted

`choose` decides, in this order (`choose_path`, pure):
1. `dra`: the API server serves `DeviceTaintRule` in `resource.k8s.io` (discovery: v1 from
   1.37, v1beta2 in 1.36, v1alpha3 in 1.33-1.35, each behind its feature gate), and a
   ResourceSlice of driver `gpu.nvidia.com` on this node publishes a device whose `uuid`
   attribute is the GPU's (the NVIDIA DRA driver names devices `gpu-N`, so the name alone
   does not say which GPU it is).
2. `device-plugin`: otherwise, if the node's allocatable `nvidia.com/gpu` is below its
   capacity (`plugin_agrees`, computed by the caller from the NodeView: one definition).
3. `node`: otherwise the whole node's ladder.
A discovery or list that fails raises (`Unavailable`, ...): the caller acts on nothing
this pass, never on a guessed path.

The rule is cluster-scoped, named after the device (`rule_name`), labelled as ours, with
`spec.deviceSelector{driver, pool, device}` and `spec.taint{key: gpuvigil.io/gpu-isolated,
value: <reason>, effect, timeAdded}`. Effects are `None` (a dry run: 1.35+ only; an older
API refuses it, and `taint` returns False) and `NoSchedule`. Never `NoExecute`: its
evictions delete pods past their PodDisruptionBudgets. The holders are evicted by the
controller through the Eviction API and the capacity gate. Release deletes the rule.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuvigil.platform.clusters.base import Forbidden, GpuEnforcement, NotFound
from gpuvigil.platform.clusters.dra_objects import (
    DRIVER,
    GROUP,
    TAINT_KEY,
    VERSIONS,
    Choice,
    Device,
    Effect,
    Served,
    choose_path,
    claim_pods,
    device_of,
    enforces,
    ours,
    parse_device,
    rule_body,
    rule_name,
)
from gpuvigil.platform.clusters.k8s_api import api_call, json_object

__all__ = [
    "DRIVER",
    "TAINT_KEY",
    "Choice",
    "Device",
    "DeviceTaints",
    "Served",
    "choose_path",
    "rule_body",
    "rule_name",
]
Write = Callable[[str, Callable[[float], Any]], Any]


class DeviceTaints:
    """The DRA side of the API server: discovery, slices, claims and our DeviceTaintRules."""

    def __init__(
        self,
        api_client: Any,
        *,
        timeout_s: float = 10.0,
        write: Write | None = None,
        calls: Counter[str] | None = None,
        driver: str = DRIVER,
    ) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout = timeout_s
        self.calls = calls if calls is not None else Counter()
        self.driver = driver
        # Unfenced by default (a test, a tool); the controller passes its fenced `_write`.
        self._write: Write = write or (lambda op, call: api_call(lambda: call(self.timeout)))

    # ---- reads --------------------------------------------------------------------------

    def _discover(self, call: Callable[[], Any]) -> dict[str, Any]:
        """One discovery document as JSON (a 404: empty)."""
        self.calls["dra_discovery"] += 1
        try:
            resp = api_call(call)
        except NotFound:
            return {}
        data = json_object(resp.data.decode() if isinstance(resp.data, bytes) else resp.data)
        return data or {}

    def served(self) -> Served:
        """Which versions of `resource.k8s.io` serve the kinds we use (none: all None)."""
        from kubernetes import client

        groups = self._discover(
            lambda: client.ApisApi(self.api_client).get_api_versions(
                _preload_content=False, _request_timeout=self.timeout
            )
        )
        versions = {
            v.get("version")
            for g in groups.get("groups") or ()
            if isinstance(g, dict) and g.get("name") == GROUP
            for v in g.get("versions") or ()
            if isinstance(v, dict)
        }
        found: dict[str, str] = {}
        for version in (v for v in VERSIONS if v in versions):
            listing = self._discover(
                lambda v=version: self.custom.get_api_resources(
                    GROUP, v, _preload_content=False, _request_timeout=self.timeout
                )
            )
            for res in listing.get("resources") or ():
                name = res.get("name") if isinstance(res, dict) else None
                if name in ("devicetaintrules", "resourceslices", "resourceclaims"):
                    found.setdefault(name, version)
        return Served(
            found.get("devicetaintrules"), found.get("resourceslices"), found.get("resourceclaims")
        )

    def _list(self, version: str, plural: str, **kw: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            self.calls[f"list_{plural}"] += 1
            page = api_call(
                lambda t=token: self.custom.list_cluster_custom_object(
                    GROUP, version, plural, limit=500, _continue=t,
                    _request_timeout=self.timeout, **kw,
                )
            )  # fmt: skip
            items += [i for i in page.get("items") or () if isinstance(i, dict)]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def device(self, served: Served, *, node: str, gpu_uuid: str) -> Device | None:
        if served.slices is None:
            return None
        try:
            slices = self._list(
                served.slices, "resourceslices", field_selector=f"spec.nodeName={node}"
            )
        except Forbidden:
            # A server without that field selector (a CRD stand-in) answers 400: read all;
            # `device_of` filters by node either way.
            slices = self._list(served.slices, "resourceslices")
        return device_of(slices, node=node, gpu_uuid=gpu_uuid, driver=self.driver)

    def choose(self, *, node: str, gpu_uuid: str, plugin_agrees: bool) -> Choice:
        served = self.served()
        dev = self.device(served, node=node, gpu_uuid=gpu_uuid) if served.taint_rules else None
        return choose_path(served, dev, plugin_agrees=plugin_agrees)

    def claim_holders(self, device: Device, *, served: Served | None = None) -> list[str] | None:
        """The pods ResourceClaims reserve `device` for; None when claims are not served."""
        served = served or self.served()
        if served.claims is None:
            return None
        return claim_pods(self._list(served.claims, "resourceclaims"), device)

    def rule(self, device: Device, *, version: str | None = None) -> dict[str, Any] | None:
        """Our rule for `device` as stored (None: there is none)."""
        version = version or self.served().taint_rules
        if version is None:
            return None
        self.calls["get_devicetaintrule"] += 1
        try:
            return api_call(
                lambda: self.custom.get_cluster_custom_object(
                    GROUP, version, "devicetaintrules", rule_name(device),
                    _request_timeout=self.timeout,
                )
            )  # fmt: skip
        except NotFound:
            return None

    # ---- writes (fenced) ------------------------------------------------------------------

    def taint(
        self,
        device: Device,
        *,
        reason: str,
        effect: Effect,
        version: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        """Create our rule for `device`, or move its effect. False: the API refused the
        effect (`None` before 1.35); True: the rule now carries `effect`."""
        version = version or self.served().taint_rules
        if version is None:
            raise NotFound(f"{GROUP} serves no DeviceTaintRule")
        body = rule_body(device, version=version, reason=reason, effect=effect,
                         now=now or datetime.now(UTC))  # fmt: skip
        name = body["metadata"]["name"]
        current = self.rule(device, version=version)
        if current is not None and not ours(current):
            raise Forbidden(f"DeviceTaintRule {name} exists and is not gpuvigil's")
        try:
            if current is None:
                self._write(
                    "create_devicetaintrule",
                    lambda t: self.custom.create_cluster_custom_object(
                        GROUP, version, "devicetaintrules", body, _request_timeout=t
                    ),
                )
                return True
            if ((current.get("spec") or {}).get("taint") or {}).get("effect") == effect:
                return True
            patch = {"spec": {"taint": body["spec"]["taint"]}}
            self._write(
                "patch_devicetaintrule",
                lambda t: self.custom.patch_cluster_custom_object(
                    GROUP, version, "devicetaintrules", name, patch, _request_timeout=t
                ),
            )
            return True
        except Forbidden as e:
            if effect == "None" and "effect" in str(e):
                return False  # an API before the dry-run effect: go straight to NoSchedule
            raise

    def release(self, device: Device, *, version: str | None = None) -> None:
        """Delete our rule for `device`; already gone is done. A rule of that name that is
        not ours is left alone (deleted only with the uid we read: a Conflict otherwise)."""
        version = version or self.served().taint_rules
        current = self.rule(device, version=version) if version else None
        if version is None or current is None or not ours(current):
            return
        uid = (current.get("metadata") or {}).get("uid")
        body = {"preconditions": {"uid": uid}} if uid else None
        try:
            self._write(
                "delete_devicetaintrule",
                lambda t: self.custom.delete_cluster_custom_object(
                    GROUP, version, "devicetaintrules", rule_name(device), body=body,
                    _request_timeout=t,
                ),
            )  # fmt: skip
        except NotFound:
            pass

    # ---- the controller's per-GPU path (clusters.base.GpuEnforcement) ---------------------

    def enforcement(
        self, node: str, gpu_uuid: str, *, plugin_agrees: bool, device: str | None
    ) -> GpuEnforcement | None:
        """For a new isolation (`device` None): DRA when `choose_path` says so, with the
        holders ResourceClaims name; None otherwise (the device plugin's or the whole
        node's way). For a DRA record (`device` its resource id): whether our rule stands
        as NoSchedule, and the holders."""
        served = self.served()
        if device is None:
            dev = self.device(served, node=node, gpu_uuid=gpu_uuid) if served.taint_rules else None
            choice = choose_path(served, dev, plugin_agrees=plugin_agrees)
            if choice.path != "dra" or choice.device is None:
                return None
            return GpuEnforcement("dra", True, self.claim_holders(choice.device, served=served),
                                  choice.device.resource_id, choice.why)  # fmt: skip
        dev = parse_device(device, uuid=gpu_uuid)
        if dev is None or served.taint_rules is None:
            return GpuEnforcement("dra", False, None, device, "no DeviceTaintRule served")
        if not enforces(self.rule(dev, version=served.taint_rules), dev):
            return GpuEnforcement("dra", False, None, device, "our DeviceTaintRule is gone")
        return GpuEnforcement("dra", True, self.claim_holders(dev, served=served), device)

    def isolate(self, device: str, *, gpu_uuid: str, reason: str) -> str:
        """Dry run (effect None), then NoSchedule, then read back: "" when the rule stands;
        else why not (the caller gives the node to its whole ladder). Errors raise."""
        dev = parse_device(device, uuid=gpu_uuid)
        version = self.served().taint_rules
        if dev is None or version is None:
            return "no DeviceTaintRule served"
        if not self.taint(dev, reason=reason, effect="None", version=version):
            return "the API refused the dry-run effect None"
        self.taint(dev, reason=reason, effect="NoSchedule", version=version)
        if not enforces(self.rule(dev, version=version), dev):
            return "the DeviceTaintRule read back does not keep work off the device"
        return ""

    def release_device(self, device: str) -> None:
        """`release` by resource id (an isolation record's `device`); garbage: nothing."""
        dev = parse_device(device)
        if dev is not None:
            self.release(dev)
