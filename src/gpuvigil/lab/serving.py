"""The lab's serving workload (`gpuvigil lab --workload serving`): an inference Deployment
behind a PodDisruptionBudget and an HPA, on the GPU nodes, next to the training job; the
controller protects it as a user configures it (a `controller.serving` pool in its config
file, docs/serving.md).

- The Deployment `inference/llm-server`: `DEMAND` replicas of one GPU each, run by the real
  deployment and replicaset controllers, placed by the real scheduler. A replica is a
  container that does nothing until stopped (the kubelet's pause container): the lab's
  kubelet runs no probes, so a replica is Ready once its container runs.
- The PDB `minAvailable: 100%` (the real disruption controller answers each eviction
  with 429): the PDB a user writes to mean "never below what runs", which a drain can only
  pass at its deadline.
- The autoscaling/v2beta2 HPA `llm-server`. No metrics server or HPA controller runs, so
  the lab writes its status as the HPA controller would: `desiredReplicas` is the demand
  clamped to `minReplicas`..`maxReplicas` (the controller's make-before-break raises
  `minReplicas`), `observedGeneration` the spec it read, `ScalingActive=True`.

`Serving.sync` runs on every lab pass with the pod list the kubelets use. Its `min_ready`
is a bound, not a sample: the replicas Ready (and not terminating) in two consecutive
pod lists were Ready all the time between (readiness here comes and goes only by the
lab's own kubelet, which runs no probes), so the least of those counts is the fewest
Ready replicas there can have been at any moment, however far apart the lists were.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from gpuvigil.core.config import deep_merge
from gpuvigil.lab.config import LabConfig

NAMESPACE = "inference"
NAME = "llm-server"
POOL = "llm"
DEMAND = 4  # replicas the HPA asks for: the pool's demand
MAX_REPLICAS = 8  # the HPA's maxReplicas: room for make-before-break
LABELS = {"app.kubernetes.io/name": NAME}
HPA = ("autoscaling", "v2beta2", NAMESPACE, "horizontalpodautoscalers", NAME)
DEPLOYMENT = ("apps", "v1", NAMESPACE, "deployments", NAME)
MARK = "gpuvigil.io/serving-scale-up"  # clusters.k8s_serving.MARK_ANNOTATION, read only
WRITE_EVERY_S = 1.0  # the HPA controller's sync is 15 s; sooner here, as the lab's intervals


def pool_config() -> dict[str, Any]:
    """The `controller.serving` section the lab's controller is configured with."""
    return {
        "pools": [
            {
                "name": POOL,
                "namespace": NAMESPACE,
                "workload": {"kind": "Deployment", "name": NAME},
                "gpus_per_replica": 1,
                "demand": [{"kind": "hpa", "name": NAME}],
                "ready_timeout_s": 120,
            }
        ]
    }


def _objects() -> list[tuple[tuple[str, str, str], dict[str, Any]]]:
    pod = {
        "metadata": {"labels": dict(LABELS)},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "server", "image": "registry.k8s.io/pause:3.9",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }  # fmt: skip
    return [
        (("apps", "v1", "deployments"), {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME},
            "spec": {"replicas": DEMAND, "selector": {"matchLabels": dict(LABELS)},
                     "template": pod},
        }),
        (("policy", "v1beta1", "poddisruptionbudgets"), {
            "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
            "metadata": {"name": NAME},
            "spec": {"minAvailable": "100%", "selector": {"matchLabels": dict(LABELS)}},
        }),
        (("autoscaling", "v2beta2", "horizontalpodautoscalers"), {
            "apiVersion": "autoscaling/v2beta2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": NAME},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": NAME},
                     "minReplicas": 1, "maxReplicas": MAX_REPLICAS},
        }),
    ]  # fmt: skip


def _ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


class Serving:
    def __init__(self, api_client: Any, *, demand: int = DEMAND) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.demand = demand
        self._written: tuple[Any, ...] = ()
        self._write_at = 0.0
        self._seen: dict[str, Any] = {}  # what the timeline said last: replicas, floor
        self._ready: set[str] = set()  # pods Ready in the last list
        self._ready_on: dict[str, int] = {}  # node -> Ready replicas, last list
        self.measure()

    def measure(self) -> None:
        """Start the fault's figures (the replicas are all Ready: `all_ready`)."""
        self.min_ready: int | None = None
        self.samples, self.max_gap_s, self._at = 0, 0.0, None
        self.peak_replicas = self._seen.get("replicas") or self.demand

    def start(self) -> None:
        self.core.create_namespace({"metadata": {"name": NAMESPACE}})
        for (group, version, plural), body in _objects():
            self.custom.create_namespaced_custom_object(group, version, NAMESPACE, plural, body)

    # ---- each pass -----------------------------------------------------------------------

    def sync(self, pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """One lab pass over every pod: the figures, the HPA's status, and what changed
        (event, detail) for the timeline."""
        mine = [p for p in pods if p["metadata"].get("namespace") == NAMESPACE
                and all((p["metadata"].get("labels") or {}).get(k) == v
                        for k, v in LABELS.items())]  # fmt: skip
        ready = {p["metadata"]["name"] for p in mine if _ready(p)}
        now = time.monotonic()
        if self._at is not None:
            both = len(ready & self._ready)
            self.min_ready = both if self.min_ready is None else min(self.min_ready, both)
            self.max_gap_s = max(self.max_gap_s, now - self._at)
        self._at, self.samples = now, self.samples + 1
        out: list[tuple[str, str]] = []
        if len(ready) != len(self._ready):
            out.append(("serving.ready", f"{len(ready)} replicas Ready (demand {self.demand})"))
        self._ready = ready
        self._ready_on = {}
        for p in mine:
            if p["metadata"]["name"] in ready:
                node = p["spec"].get("nodeName") or ""
                self._ready_on[node] = self._ready_on.get(node, 0) + 1
        if now - self._write_at >= WRITE_EVERY_S:
            self._write_at = now
            out += self._autoscaler()
        return out

    def _autoscaler(self) -> list[tuple[str, str]]:
        """The HPA controller's status write, and the timeline's lines for what the
        controller changed on the Deployment and the HPA."""
        hpa = self.custom.get_namespaced_custom_object(*HPA)
        dep = self.custom.get_namespaced_custom_object(*DEPLOYMENT)
        spec = hpa.get("spec") or {}
        floor, cap = int(spec.get("minReplicas") or 1), int(spec["maxReplicas"])
        replicas = int((dep.get("spec") or {}).get("replicas") or 0)
        mark = ((dep.get("metadata") or {}).get("annotations") or {}).get(MARK)
        out: list[tuple[str, str]] = []
        for key, now, what in (("replicas", replicas, "Deployment replicas"),
                               ("floor", floor, "HPA minReplicas"),
                               ("mark", mark, "make-before-break mark")):  # fmt: skip
            was = self._seen.get(key)
            if key in self._seen and was != now:
                detail = f"{what} {was} -> {now}" if key != "mark" else (
                    f"{what} set: {now}" if now else f"{what} removed")  # fmt: skip
                out.append(("serving.scale", detail))
            self._seen[key] = now
        self.peak_replicas = max(self.peak_replicas, replicas)
        desired = min(max(self.demand, floor), cap)
        gen = (hpa.get("metadata") or {}).get("generation")
        current = int((dep.get("status") or {}).get("replicas") or 0)
        state = (gen, desired, current)
        if state != self._written:
            stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            limited = desired != self.demand
            status = {
                "observedGeneration": gen,
                "currentReplicas": current,
                "desiredReplicas": desired,
                "conditions": [
                    {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
                     "lastTransitionTime": stamp},
                    {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound",
                     "lastTransitionTime": stamp},
                    {"type": "ScalingLimited", "status": "True" if limited else "False",
                     "reason": "TooFewReplicas" if limited else "DesiredWithinRange",
                     "lastTransitionTime": stamp},
                ],
            }  # fmt: skip
            self.custom.patch_namespaced_custom_object_status(*HPA, {"status": status})
            self._written = state
        return out

    # ---- what the lab asks -----------------------------------------------------------------

    def all_ready(self) -> bool:
        return len(self._ready) >= self.demand and self._seen.get("floor") is not None

    def on(self, node: str) -> int:
        """Ready replicas on `node` (the lab breaks the job's node that holds most)."""
        return self._ready_on.get(node, 0)

    def restored(self) -> bool:
        """Back to the demand, Ready, with no make-before-break mark left."""
        return (self._seen.get("replicas") == self.demand and not self._seen.get("mark")
                and len(self._ready) >= self.demand)  # fmt: skip

    def record(self) -> dict[str, Any]:
        """The `serving` field of the lab's --json result."""
        return {
            "workload": f"{NAMESPACE}/{NAME}",
            "demand": self.demand,
            "min_ready": self.min_ready,
            "ready_now": len(self._ready),
            "peak_replicas": self.peak_replicas,
            "replicas_now": self._seen.get("replicas"),
            "restored": self.restored(),
            "samples": self.samples,
            "max_gap_s": round(self.max_gap_s, 2),
            "pdb": {"name": NAME, "minAvailable": "100%"},
        }


def describe(record: dict[str, Any]) -> str:
    """One line of the human-readable result."""
    return "serving: " + json.dumps({k: record[k] for k in ("demand", "min_ready",
                                     "peak_replicas", "restored")})  # fmt: skip


def configure(cfg: LabConfig) -> LabConfig:
    """The lab's settings with the serving workload: the controller's config file gets the
    pool; the training job's pods request no GPUs, so the replicas can share its nodes
    (each whole-node job pod would hold all 8) and the node the lab breaks holds both."""
    controller = deep_merge(cfg.controller, {"serving": pool_config()})
    return cfg.model_copy(update={"gpu_requests": False, "controller": controller})


def controllers(workload: str) -> str:
    """What the lab's kube-controller-manager runs: the DaemonSet and Job controllers, and
    for serving the Deployment's, the ReplicaSet's and the disruption controller (the
    PDB's status, which its 429s read)."""
    base = "daemonset,job"
    return f"{base},deployment,replicaset,disruption" if workload == "serving" else base
