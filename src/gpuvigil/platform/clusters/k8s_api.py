"""Kubernetes API plumbing shared by the adapter and leader election: error mapping (to
`Conflict` / `Unavailable` / `Forbidden`), client loading, the Lease store.

Used by `clusters.kubernetes` and, through `KubernetesCluster.lease_store()`, by
`platform.leader`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuvigil.core.wire import decode_time
from gpuvigil.node.sinks.kube_client import connect, describe_unreachable
from gpuvigil.platform.clusters.base import (
    ClusterError,
    Conflict,
    Forbidden,
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
    """The API client from the settings' kubeconfig and context (`node.sinks.kube_client`)."""
    return connect(kubeconfig=settings.kubeconfig, context=settings.context)


class LeaseStore:
    """coordination.k8s.io/v1 Lease reads and writes for `platform.leader` (raw dicts)."""

    def __init__(self, api_client: Any, settings: KubernetesSettings) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.ns, self.name = settings.lease_namespace, settings.lease_name
        self.timeout = settings.request_timeout_s

    def get(self) -> dict[str, Any] | None:
        try:
            resp = api_call(
                lambda: self.api.read_namespaced_lease(
                    self.name, self.ns, _preload_content=False, _request_timeout=self.timeout
                )
            )
        except NotFound:
            return None
        return json.loads(resp.data)

    def create(self, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.ns},
            "spec": spec,
        }
        api_call(
            lambda: self.api.create_namespaced_lease(self.ns, body, _request_timeout=self.timeout)
        )

    def replace(self, spec: dict[str, Any], *, version: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.ns, "resourceVersion": version},
            "spec": spec,
        }
        api_call(
            lambda: self.api.replace_namespaced_lease(
                self.name, self.ns, body, _request_timeout=self.timeout
            )
        )
