"""Kubernetes API plumbing shared by the adapter and leader election: error mapping (to
`Conflict` / `Unavailable` / `Forbidden`), client loading, the Lease store.

Used by `clusters.kubernetes` and, through `KubernetesCluster.lease_store()`, by
`platform.leader`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuvigil.core.wire import decode_time
from gpuvigil.io.kube_client import connect, describe_unreachable
from gpuvigil.platform.clusters.base import (
    ClusterError,
    Conflict,
    Forbidden,
    LeaseObject,
    NotFound,
    Unavailable,
)
from gpuvigil.platform.clusters.settings import KubernetesSettings

T = TypeVar("T")


def map_error(e: ApiException) -> ClusterError:
    if e.status == 404:
        return NotFound(f"{_kind_and_name(e)} not found")
    if e.status == 409:
        return Conflict(f"{e.status} {e.reason}")
    if e.status == 429 or (e.status or 0) >= 500:
        return Unavailable(f"{e.status} {e.reason}")
    return Forbidden(f"{e.status} {e.reason}: {_message(e)}")


def _message(e: ApiException) -> str:
    """The API server's own sentence (a Status object's `message`), not its JSON."""
    status = json_object(e.body if isinstance(e.body, str) else None)
    if status and isinstance(status.get("message"), str):
        return status["message"][:300]
    return str(e.body or "")[:200]


def _kind_and_name(e: ApiException) -> str:
    status = json_object(e.body if isinstance(e.body, str) else None) or {}
    details = status.get("details") if isinstance(status.get("details"), dict) else {}
    kind, name = details.get("kind"), details.get("name")
    if kind and name:
        return f"{str(kind).rstrip('s')} {name!r}"
    return _message(e) or "object"


def api_call(call: Callable[[], T]) -> T:
    """Run one API call, mapping failures to the errors that say what to do next."""
    try:
        return call()
    except ApiException as e:
        raise map_error(e) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise Unavailable(f"API server unreachable: {describe_unreachable(e)}") from e


def when(text: str | None) -> datetime | None:
    return decode_time(text, assume_utc=True)


def json_object(text: str | None) -> dict[str, Any] | None:
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def load_api_client(settings: KubernetesSettings) -> client.ApiClient:
    """The API client from the settings' kubeconfig and context (`io.kube_client`)."""
    return connect(kubeconfig=settings.kubeconfig, context=settings.context)


class LeaseStore:
    """The coordination.k8s.io/v1 Lease `platform.leader` elects over and `platform.budget`
    keeps the disruption budget in (its annotations). Raw JSON in and out."""

    def __init__(
        self, api_client: Any, settings: KubernetesSettings, *, calls: Counter[str] | None = None
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.ns, self.name = settings.lease_namespace, settings.lease_name
        self.timeout = settings.request_timeout_s
        self.calls = calls if calls is not None else Counter()

    def _object(self, resp: Any) -> LeaseObject:
        raw = json.loads(resp.data)
        meta = raw.get("metadata") or {}
        return LeaseObject(
            dict(raw.get("spec") or {}),
            dict(meta.get("annotations") or {}),
            str(meta.get("resourceVersion") or ""),
        )

    def _body(self, spec: Mapping[str, Any], ann: Mapping[str, str], version: str = "") -> Any:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.ns, "annotations": dict(ann)}
        if version:
            meta["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": dict(spec),
        }

    def get(self) -> LeaseObject | None:
        self.calls["lease_get"] += 1
        try:
            resp = api_call(
                lambda: self.api.read_namespaced_lease(
                    self.name, self.ns, _preload_content=False, _request_timeout=self.timeout
                )
            )
        except NotFound:
            return None
        return self._object(resp)

    def create(self, spec: Mapping[str, Any], annotations: Mapping[str, str]) -> LeaseObject:
        self.calls["lease_write"] += 1
        body = self._body(spec, annotations)
        return self._object(
            api_call(
                lambda: self.api.create_namespaced_lease(
                    self.ns, body, _preload_content=False, _request_timeout=self.timeout
                )
            )
        )

    def replace(
        self, spec: Mapping[str, Any], annotations: Mapping[str, str], *, version: str
    ) -> LeaseObject:
        """PUT with the resourceVersion read: 409 (Conflict) when anyone wrote since."""
        self.calls["lease_write"] += 1
        body = self._body(spec, annotations, version)
        return self._object(
            api_call(
                lambda: self.api.replace_namespaced_lease(
                    self.name, self.ns, body, _preload_content=False, _request_timeout=self.timeout
                )
            )
        )
