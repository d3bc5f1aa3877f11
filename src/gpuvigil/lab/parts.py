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
    """The shipped manifests of `folder` (its kustomization's resources), as written: raw
    objects through the dynamic client, so the API server alone validates them."""
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(api.api_client)
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuvigil"}}
    api.create_namespace(ns)
    for res in kust.get("resources") or []:
        for doc in yaml.safe_load_all((folder / res).read_text()):
            if doc:
                kind = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                kind.create(body=doc, namespace=doc["metadata"].get("namespace"))


def training_job(example_path: Path, cfg: LabConfig, *, events: Path, checkpoints: Path) -> GangJob:
    """The shipped Job example's pods and podFailurePolicy, running the lab's workload."""
    example = load_example(example_path)
    pod = example["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = cfg.grace_s
    if not cfg.gpu_requests:
        for c in pod["containers"]:
            c.pop("resources", None)
    return GangJob(
        name=JOB,
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
