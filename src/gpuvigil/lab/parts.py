"""What the lab sets up from the shipped files: the preflight manifests, applied as written,
and the training job built from the shipped Job example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuvigil.lab.config import LabConfig
from gpuvigil.lab.jobs import GangJob, load_example
from gpuvigil.lab.procs import free_port

JOB = "lab-train"
NAMESPACE = "default"
HOST = "$(GPUVIGIL_LAB_MACHINE)"  # a pod's path to its machine's folder (kubelet.py)


def apply_manifests(api: Any, folder: Path) -> None:
    """The shipped manifests of `folder` (its kustomization's resources, in its namespace),
    as written: raw objects through the dynamic client, so the API server alone validates
    them."""
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api.api_client)
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    default_ns = kust.get("namespace") or "default"
    for res in kust.get("resources") or []:
        for doc in yaml.safe_load_all((folder / res).read_text()):
            if doc:
                kind = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                ns = doc["metadata"].get("namespace") or default_ns if kind.namespaced else None
                kind.create(body=doc, namespace=ns)


def cluster_prerequisites(api: Any) -> None:
    """What gpuvigil's manifests expect a GPU cluster to have: its namespace, and the NVIDIA
    GPU operator's RuntimeClass `nvidia` (the preflight pod names it)."""
    from kubernetes import client

    api.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": "gpuvigil"}})  # fmt: skip
    client.NodeV1Api(api.api_client).create_runtime_class(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
    )


def trust_key(api: Any, *, namespace: str = "gpuvigil", name: str = "gpuvigil-trust") -> str:
    """The controller's public key as it publishes it (the ConfigMap the agent DaemonSet
    mounts at /etc/gpuvigil/trust), or "" before it has."""
    try:
        cm = api.read_namespaced_config_map(name, namespace)
    except Exception as e:  # not published yet: 404
        if "404" in str(e):
            return ""
        raise
    return str((cm.data or {}).get("controller.pub", ""))


def training_job(
    example_path: Path, cfg: LabConfig, *, name: str, events: Path, checkpoints: Path
) -> GangJob:
    """The shipped Job example's pods and podFailurePolicy, running the lab's workload."""
    example = load_example(example_path)
    pod = example["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = cfg.grace_s
    if not cfg.gpu_requests:
        for c in pod["containers"]:
            c.pop("resources", None)
    return GangJob(
        name=name,
        namespace=NAMESPACE,
        example=example,
        ranks=2,
        args=[
            "-m",
            "gpuvigil.lab.workload",
            f"--steps={cfg.steps}",
            f"--step-ms={cfg.step_ms}",
            f"--checkpoint-dir={checkpoints}",
            f"--checkpoint-every={cfg.checkpoint_every}",
        ],
        env={
            "GPUVIGIL__TRAINING__EVENTS_FILE": str(events / "training.jsonl"),
            # the DaemonSet's hostPath /run/gpuvigil, where the agent's report is
            "GPUVIGIL__TRAINING__HEALTH_GATE__STATE_FILE": f"{HOST}/run/report.json",
            "GPUVIGIL__TRAINING__WATCHDOG__TIMEOUT_S": str(cfg.watchdog_timeout_s),
        },
        port_for=free_port,
    )
