"""The one way gpuvigil builds a Kubernetes API client (agent sink, controller, `nodes`,
`release`): which credentials, in which order, and what a person reads when none work.

Order: an explicit kubeconfig (`--kubeconfig`, or a config file's `kubeconfig:`), else the
pod's service account when running in a pod, else `$KUBECONFIG`, else `~/.kube/config`.
`--context` picks a context of the kubeconfig. Every failure is a `KubeConfigError` whose
message names the file and what to do, never the client library's "Invalid kube-config
file" alone. The client does not retry on its own (urllib3's default retries print four
warnings per call against a dead API server): callers retry on their own schedule.
The `kubernetes` package is imported only when a client is built.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
DEFAULT_KUBECONFIG = Path("~/.kube/config")


class KubeConfigError(ValueError):
    """No usable credentials; the message says which were tried and what to do."""


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and IN_CLUSTER_TOKEN.exists()


def _default_files() -> list[Path]:
    env = os.environ.get("KUBECONFIG", "")
    files = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return files or [DEFAULT_KUBECONFIG.expanduser()]


def _quiet_urllib3() -> None:
    # A dead API server is reported once, by the caller, as Unavailable; the pool's own
    # "Retrying (Retry(total=2...))" warnings would repeat it on every call.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)


def connect(
    *, kubeconfig: str | Path | None = None, context: str | None = None
) -> Any:  # kubernetes.client.ApiClient
    """An API client for the first credentials that exist (see the module docstring)."""
    from kubernetes import client, config

    _quiet_urllib3()
    cfg = client.Configuration()
    if kubeconfig is None and context is None and _in_cluster():
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as e:
            raise KubeConfigError(f"in-cluster service account unusable: {e}") from e
    else:
        files = [Path(kubeconfig).expanduser()] if kubeconfig else _default_files()
        present = [f for f in files if f.is_file()]
        if not present:
            where = ", ".join(str(f) for f in files)
            hint = (
                "pass --kubeconfig FILE (or set $KUBECONFIG), or run in a pod with a "
                "service account"
            )
            raise KubeConfigError(f"no Kubernetes credentials: {where} does not exist; {hint}")
        try:
            config.load_kube_config(
                config_file=str(present[0]),
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        except config.ConfigException as e:
            raise KubeConfigError(_explain(present[0], context, e)) from e
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:  # not a kubeconfig
            raise KubeConfigError(f"kubeconfig {present[0]} unreadable: {e}") from e
    cfg.retries = 0
    if not cfg.verify_ssl:  # the kubeconfig says insecure-skip-tls-verify: chosen, not news
        import warnings

        import urllib3

        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    return client.ApiClient(configuration=cfg)


def _explain(path: Path, context: str | None, e: Exception) -> str:
    from kubernetes import config

    text = str(e)
    if context:
        try:
            contexts, _ = config.list_kube_config_contexts(config_file=str(path))
            names = [c.get("name") for c in contexts or []]
        except (config.ConfigException, OSError, ValueError, yaml.YAMLError):
            names = []
        if context not in names:
            known = ", ".join(str(n) for n in names) or "none"
            return f"kubeconfig {path} has no context {context!r} (contexts: {known})"
    return f"kubeconfig {path} unusable: {text}"


def describe_unreachable(e: BaseException) -> str:
    """A one-line reason for a failed connection (urllib3 wraps it three levels deep)."""
    reason = getattr(e, "reason", None) or e
    text = str(reason)
    for known in (
        "Connection refused",
        "timed out",
        "Name or service not known",
        "No route to host",
        "certificate verify failed",
    ):
        if known.lower() in text.lower():
            return known.lower()
    return text.split(": ", 1)[-1][:200]
