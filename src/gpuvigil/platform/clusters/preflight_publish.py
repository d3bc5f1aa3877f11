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


def publish_kubernetes(
    node: str, value: dict[str, str], *, kubeconfig: str | None = None, api: Any = None
) -> None:
    """Patch the Node's annotation. In a pod: the in-cluster service account (needs
    `patch` on `nodes`); elsewhere: `kubeconfig` or the default kubeconfig."""
    try:
        if api is None:
            from kubernetes import client, config

            try:
                if kubeconfig:
                    config.load_kube_config(config_file=kubeconfig)
                else:
                    config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CoreV1Api()
        body = {"metadata": {"annotations": {PREFLIGHT_ANNOTATION: json.dumps(value)}}}
        api.patch_node(node, body, _request_timeout=TIMEOUT_S)
    except Exception as e:
        raise PublishError(f"could not annotate node {node!r}: {type(e).__name__}: {e}") from e
