"""What the lab sets up from the shipped files: the manifests of deploy/kubernetes applied
by the real kubectl (their RBAC then governs the controller and the agents), and the
training job built from the shipped Job example."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuvigil.io.ports import free_port
from gpuvigil.lab.config import LabConfig
from gpuvigil.lab.image import Image
from gpuvigil.lab.jobs import GangJob, load_example, load_manifests
from gpuvigil.lab.kubelet import GPU_RESOURCE

JOB = "lab-train"
EXAMPLES = {"in-process": "training-job-inprocess.yaml", "gang": "training-job.yaml"}
CHECKPOINTS = "checkpoints"  # the example's checkpoint volume
NAMESPACE = "default"
HOST = "$(GPUVIGIL_LAB_MACHINE)"  # a pod's path to its machine's folder (kubelet.py)


# The workloads whose pods the lab runs itself (the agent on each emulated machine, the
# controller beside them); every other shipped object is applied as a user would.
RUN_BY_THE_LAB = {"DaemonSet", "Deployment"}


def apply_shipped(kubeconfig: Path, folder: Path) -> list[str]:
    """The kustomization in `folder` as a user installs it: rendered and applied by the real
    kubectl (its namespace, ServiceAccounts, RBAC, ConfigMaps and the preflight
    PodTemplate), less `RUN_BY_THE_LAB`. Returns "Kind/name" of what was applied; raises
    RuntimeError with kubectl's message when the API server refuses any of it."""
    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig)]
    rendered = subprocess.run([*kubectl, "kustomize", str(folder)], check=False,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    if rendered.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {folder}: {rendered.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    keep = [d for d in docs if d["kind"] not in RUN_BY_THE_LAB]
    applied = subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(keep),
                             check=False, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    if applied.returncode != 0:
        raise RuntimeError(f"kubectl apply -k {folder}: {applied.stderr.strip()}")
    return [f"{d['kind']}/{d['metadata']['name']}" for d in keep]


def cluster_prerequisites(api: Any) -> None:
    """What gpuvigil's manifests expect a GPU cluster to have: the NVIDIA GPU operator's
    RuntimeClass `nvidia` (the preflight pod names it)."""
    from kubernetes import client

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
    example_path: Path,
    cfg: LabConfig,
    *,
    name: str,
    events: Path,
    checkpoints: Path,
    gpus: int | None = None,
    image: bool,
    store: str | None = None,
) -> GangJob:
    """The shipped Job example's pods and podFailurePolicy, running the lab's workload;
    `store`: host:port of the job's store server, for the in-process example (one pod per
    rank, `cfg.restart == "in-process"`: the lab's GangJob in index mode); else the
    torchrun example (gang mode);
    `gpus`: each pod's `nvidia.com/gpu` instead of the example's (every GPU of a node).
    `checkpoints`: the lab's folder standing for the example's checkpoint claim (each job
    saves in its `name` below it). `image`: the pods run from the built image, with the
    example's securityContext and volumes (`checkpoints` given to its pod's user and
    fsGroup, as a provisioned volume is); else from this machine's Python, as root."""
    example = load_example(example_path)
    pod = example["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = cfg.grace_s
    if gpus is not None:
        for c in pod["containers"]:
            c.setdefault("resources", {}).setdefault("limits", {})[GPU_RESOURCE] = str(gpus)
    if not cfg.gpu_requests:
        for c in pod["containers"]:
            c.pop("resources", None)
    trainer = pod["containers"][0]
    checkpoints.mkdir(parents=True, exist_ok=True)
    env = {"GPUVIGIL__TRAINING__EVENTS_FILE": str(events / "training.jsonl"),
           "GPUVIGIL__TRAINING__WATCHDOG__TIMEOUT_S": str(cfg.watchdog_timeout_s)}  # fmt: skip
    volumes: dict[str, dict[str, Any]] | None = None
    if image:
        mounts = {m["name"]: m["mountPath"] for m in trainer.get("volumeMounts") or []}
        saves = f"{mounts[CHECKPOINTS]}/{name}"
        # the health gate reads the training config's default state file, which the
        # example's hostPath mount of /run/gpuvigil holds (the agent's report)
        pod_sc = pod.get("securityContext") or {}
        security = Image.security(pod_sc, trainer.get("securityContext") or {})
        os.chown(checkpoints, security["uid"], int(pod_sc.get("fsGroup", security["gid"])))
        volumes = {CHECKPOINTS: {"hostPath": {"path": str(checkpoints)}},
                   "lab-events": {"hostPath": {"path": str(events)}}}  # fmt: skip
    else:
        saves = str(checkpoints / name)
        # the DaemonSet's hostPath /run/gpuvigil, where the agent's report is
        env["GPUVIGIL__TRAINING__HEALTH_GATE__STATE_FILE"] = f"{HOST}/run/report.json"
    index = store is not None
    if index:
        # The example's in-process settings, and the lab's: its store (no DNS here), this
        # job's id (each fault runs a fresh job), the survivors' wait for a replacement
        env |= {"GPUVIGIL__TRAINING__RESTART__STORE": str(store),
                "GPUVIGIL__TRAINING__JOB_ID": name,
                "GPUVIGIL__TRAINING__RESTART__JOIN_TIMEOUT_S": str(cfg.join_timeout_s),
                "GPUVIGIL__TRAINING__MEMTIER__EVERY_STEPS": str(cfg.memtier_every)}  # fmt: skip
        if not image:  # the example's memory-backed /dev/shm emptyDir: the machine's folder
            env["GPUVIGIL__TRAINING__MEMTIER__DIR"] = f"{HOST}/shm/{{job}}"
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
            f"--checkpoint-dir={saves}",
            f"--checkpoint-every={cfg.checkpoint_every}",
        ],
        env=env,
        port_for=free_port,
        mode="index" if index else "gang",
        volumes=volumes,
        # the lab's event folder, where every part writes its events (its log collector)
        mounts=[{"name": "lab-events", "mountPath": str(events)}] if image else [],
    )


def store_argv(example_path: Path, *, port: int) -> list[str]:
    """The in-process example's store server as its Deployment's container runs it (its
    command and args), on loopback and `port`: the lab runs it as a process of its own,
    standing for that pod on a CPU node, which the lab's GPU nodes are not."""
    (deploy,) = [d for d in load_manifests(example_path) if d.get("kind") == "Deployment"]
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    argv = [*c.get("command", []), *c.get("args", [])]
    argv = [a for a in argv if not a.startswith(("--port", "--host"))]
    if argv[:1] == ["python"]:
        argv[0] = sys.executable
    return [*argv, "--host=127.0.0.1", f"--port={port}"]
