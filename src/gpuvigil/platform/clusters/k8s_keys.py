"""The controller's signing key on Kubernetes: where it lives and how agents learn its public
half. Called by `clusters.kubernetes` the first time it signs (a remediation request, a
release); `gpuvigil controller` calls it at start so agents have the public key early.

- `signing_key_file` set: the key is that PEM file (a Secret you mount, a key you manage);
  nothing is created, and you give the agents the public key yourself.
- otherwise the Secret `signing_key_secret` in `key_namespace` holds it (`controller.key`);
  the first controller to start creates it (two replicas racing: one create wins, the other
  reads it). Its public half is kept in the ConfigMap `trust_configmap` (`controller.pub`),
  which the agent DaemonSet mounts at /etc/gpuvigil/trust. Only the controller's account may
  read the Secret or change the ConfigMap (deploy/kubernetes/controller/rbac.yaml).

Rotation: delete the Secret and restart the controller; a new key is made and published,
replacing the old one in the ConfigMap. Agents read the mounted file for every message and
cache nothing, so the old key stops verifying as soon as the kubelet updates the file;
requests signed with it and not yet acted on are ignored, and those steps time out.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from gpuvigil.core.signing import BadKey, Signer
from gpuvigil.platform.clusters.base import Conflict, Forbidden, NotFound
from gpuvigil.platform.clusters.k8s_api import api_call

KEY_FIELD = "controller.key"
PUB_FIELD = "controller.pub"


def load_signer(core: Any, settings: Any) -> Signer:  # KubernetesSettings
    if settings.signing_key_file:
        try:
            return Signer.from_pem(Path(settings.signing_key_file).read_bytes())
        except (OSError, BadKey) as e:
            raise Forbidden(f"signing key {settings.signing_key_file}: {e}") from e
    ns, name, t = settings.key_namespace, settings.signing_key_secret, settings.request_timeout_s
    signer = _read_secret(core, ns, name, t)
    if signer is None:
        fresh = Signer.generate()
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gpuvigil"}},
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(fresh.private_pem()).decode()},
        }
        try:
            api_call(lambda: core.create_namespaced_secret(ns, body, _request_timeout=t))
            signer = fresh
        except Conflict:  # another replica made it first
            signer = _read_secret(core, ns, name, t)
            if signer is None:
                raise Forbidden(f"secret {ns}/{name} vanished while it was created") from None
    _publish(core, settings, signer)
    return signer


def _read_secret(core: Any, ns: str, name: str, timeout: float) -> Signer | None:
    try:
        resp = api_call(
            lambda: core.read_namespaced_secret(
                name, ns, _preload_content=False, _request_timeout=timeout
            )
        )
    except NotFound:
        return None
    data = (json.loads(resp.data).get("data") or {}).get(KEY_FIELD)
    try:
        return Signer.from_pem(base64.b64decode(data or ""))
    except (BadKey, ValueError) as e:
        raise Forbidden(f"secret {ns}/{name} holds no usable key: {e}") from e


def _publish(core: Any, settings: Any, signer: Signer) -> None:
    """The public key in the trust ConfigMap (created, or updated when it differs)."""
    ns, name, t = settings.key_namespace, settings.trust_configmap, settings.request_timeout_s
    pem = signer.public_pem().decode()
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gpuvigil"}},
        "data": {PUB_FIELD: pem},
    }
    try:
        resp = api_call(
            lambda: core.read_namespaced_config_map(
                name, ns, _preload_content=False, _request_timeout=t
            )
        )
    except NotFound:
        try:
            api_call(lambda: core.create_namespaced_config_map(ns, body, _request_timeout=t))
        except Conflict:
            pass  # another replica published the same key
        return
    cm = json.loads(resp.data)
    data = cm.get("data") or {}
    if data.get(PUB_FIELD) != pem:  # the other keys (the agents' pins, `k8s_pins`) stay
        body["data"] = {**data, PUB_FIELD: pem}
        body["metadata"] = {**cm.get("metadata", {}), **body["metadata"]}
        api_call(lambda: core.replace_namespaced_config_map(name, ns, body, _request_timeout=t))
