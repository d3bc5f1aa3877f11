"""Publish a preflight result where the controller reads it: on Kubernetes, the node
annotation `core.wire.PREFLIGHT_ANNOTATION`. Called by `gpuvigil preflight --publish
kubernetes`. (On Slurm the prolog script acts on preflight's exit status: docs/preflight.md.)
"""

from __future__ import annotations

import json
from typing import Any

from gpuvigil.core.wire import PREFLIGHT_ANNOTATION

TIMEOUT_S = 10.0


class PublishError(Exception):
    """The result could not be recorded; preflight then exits non-zero (fail closed)."""


def connect(kubeconfig: str | None = None) -> Any:
    """The Kubernetes API client: in a pod, the in-cluster service account; elsewhere
    `kubeconfig` or the default kubeconfig."""
    try:
        from kubernetes import client, config

        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig)
            else:
                config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return client.CoreV1Api()
    except Exception as e:
        raise PublishError(f"no Kubernetes credentials: {type(e).__name__}: {e}") from e


def _patch(api: Any, node: str, value: dict[str, str], *, dry_run: bool) -> None:
    body = {"metadata": {"annotations": {PREFLIGHT_ANNOTATION: json.dumps(value)}}}
    extra = {"dry_run": "All"} if dry_run else {}
    api.patch_node(node, body, _request_timeout=TIMEOUT_S, **extra)


def check_access(node: str, *, kubeconfig: str | None = None, api: Any = None) -> Any:
    """Before preflight's slow work: load the credentials and make a server-side dry run of
    the very patch `publish_kubernetes` will send (the API server checks the Node exists
    and that this identity may patch it, and changes nothing). Returns the client."""
    api = api if api is not None else connect(kubeconfig)
    try:
        _patch(api, node, {"result": "pending"}, dry_run=True)
    except Exception as e:
        raise PublishError(f"cannot annotate node {node!r}: {type(e).__name__}: {e}") from e
    return api


def publish_kubernetes(
    node: str, value: dict[str, str], *, kubeconfig: str | None = None, api: Any = None
) -> None:
    """Patch the Node's annotation (needs `patch` on `nodes`)."""
    try:
        _patch(api if api is not None else connect(kubeconfig), node, value, dry_run=False)
    except Exception as e:
        raise PublishError(f"could not annotate node {node!r}: {type(e).__name__}: {e}") from e
