"""A real kube-apiserver (v1.20.2, built by scripts/build-kube.sh) with etcd, on loopback.

Nodes and pods exist without kubelets: tests create them and drive their status. New
nodes get the `node.kubernetes.io/not-ready` taint from admission; `create_node` removes it.
Eviction is served as policy/v1beta1 only by this version.
"""

from __future__ import annotations

import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from gpuvigil.lab.control_plane import ControlPlane, missing
from realparts.procs import wait_until

TOKEN = "gpuvigil-test-admin-token"
# Admins whose writes the API server's audit log records (request bodies included), for
# tests that must know who wrote what, when, by the server's clock (split brain). Everyone
# else is not audited: the log stays small.
AUDITED = tuple(f"gpuvigil-audited-{i}" for i in range(4))
# Nodes with an identity of their own (`node_kubeconfig`): as their kubelet would be,
# `system:node:<name>` in `system:nodes`, kept to their own Node by the API server.
NODE_IDENTITIES = tuple(f"gpu-ident-{i}" for i in range(6))
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Request
  users: [{}]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
""".format(", ".join(f'"{u}"' for u in AUDITED))


def available() -> tuple[bool, str]:
    why = missing()
    return why is None, why or ""


class KubeCluster:
    """etcd + kube-apiserver (`gpuvigil.lab.control_plane`, the lab's own); the scheduler
    and the disruption controller on demand."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.cp = ControlPlane(workdir, controllers=None, token=TOKEN, context="test",
                               users=AUDITED, audit_policy=AUDIT_POLICY,
                               nodes=NODE_IDENTITIES)  # fmt: skip
        self.port = self.cp.port
        self.url = self.cp.url
        self.kubeconfig = self.cp.kubeconfig
        self.audit_log = self.cp.audit_log
        self._controllers: set[str] = set()  # what kube-controller-manager runs

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.cp.start(scheduler=False)

    def stop(self) -> None:
        self.cp.stop()

    def node_kubeconfig(self, node: str) -> Path:
        """A kubeconfig with the identity of node `node` (one of `NODE_IDENTITIES`), as the
        kubelet's credentials the default deploy's agent uses."""
        return self.cp.kubeconfig_for_node(node)

    def audited_kubeconfig(self, user: str) -> Path:
        """A kubeconfig for one of `AUDITED`: its writes are in `audit_events()`."""
        return self.cp.kubeconfig_for(user)

    def audit_events(self, users: tuple[str, ...]) -> list[dict[str, Any]]:
        """The audit log's completed requests by these users, in the order written."""
        import json

        out = []
        for line in self.audit_log.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("stage") == "ResponseComplete" and ev["user"]["username"] in users:
                out.append(ev)
        return out

    def start_scheduler(self) -> None:
        """A real kube-scheduler: it honours NoSchedule taints and nvidia.com/gpu capacity."""
        self.cp.start_scheduler()

    def start_disruption_controller(self) -> None:
        """kube-controller-manager with the disruption controller: PDBs give 429."""
        self.start_controllers("disruption")

    def start_controllers(self, *names: str) -> None:
        """kube-controller-manager running at least `names` (e.g. "deployment",
        "replicaset"): restarted with the union when one is missing."""
        want = self._controllers | set(names)
        if want == self._controllers:
            return
        old = self.cp.procs.pop("kube-controller-manager", None)
        if old is not None:
            old.stop()
        self.cp.start_controllers(",".join(sorted(want)))
        self._controllers = want

    # -- clients and helpers ---------------------------------------------------------------
    def api_client(self, token: str = TOKEN) -> Any:
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.verify_ssl = False
        cfg.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(cfg)

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )

    def kustomize(self, folder: Path) -> str:
        """The manifests of the kustomization in `folder`, as the real kubectl renders them."""
        rendered = self.kubectl("kustomize", str(folder))
        assert rendered.returncode == 0, rendered.stderr
        return rendered.stdout

    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should talk to this cluster (KUBECONFIG)."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def create_node(
        self,
        name: str | None = None,
        *,
        labels: dict[str, str] | None = None,
        gpus: int = 8,
        taints: list[dict[str, str]] | None = None,
    ) -> str:
        """A Node without a kubelet: Ready, with GPU capacity, without the not-ready taint."""
        name = name or f"gpu-{uuid.uuid4().hex[:8]}"
        v1 = self.core()
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []},
        }
        v1.create_node(body)
        cap = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        v1.patch_node_status(
            name,
            {
                "status": {
                    "capacity": cap,
                    "allocatable": cap,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "test node",
                        }
                    ],
                }
            },
        )

        def untainted() -> bool:
            n = v1.read_node(name)
            foreign = [t for t in (n.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]
            if foreign:
                keep = [
                    {"key": t.key, "value": t.value, "effect": t.effect}
                    for t in (n.spec.taints or [])
                    if not t.key.startswith("node.kubernetes.io/")
                ]
                v1.patch_node(name, {"spec": {"taints": keep}})
                return False
            return True

        wait_until(untainted, timeout=10, what=f"node {name} without not-ready taint")
        return name

    def unschedulable_pod(
        self, namespace: str, *, node_selector: dict[str, str], timeout: float = 30
    ) -> str:
        """Create a pod `p` for kube-scheduler (start_scheduler first) to place with
        `node_selector`, wait until the scheduler gives up on it (PodScheduled False,
        Unschedulable) and return why (the condition's message); the pod stays unbound."""
        v1 = self.core()
        v1.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"nodeSelector": node_selector, "containers": [{"name": "c", "image": "x"}]},
        })  # fmt: skip

        def refused() -> str | None:
            pod = v1.read_namespaced_pod("p", namespace)
            cond = {c.type: c for c in pod.status.conditions or []}.get("PodScheduled")
            if cond is not None and cond.reason == "Unschedulable":
                assert pod.spec.node_name is None
                return str(cond.message)
            return None

        return str(wait_until(refused, timeout=timeout, what="the scheduler to refuse pod p"))

    def create_running_pod(
        self,
        node: str,
        *,
        namespace: str = "default",
        name: str | None = None,
        labels: dict[str, str] | None = None,
        gpus: int = 0,
    ) -> str:
        """A pod bound to `node` and marked Running+Ready (no kubelet runs it)."""
        name = name or f"pod-{uuid.uuid4().hex[:8]}"
        v1 = self.core()
        resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
        v1.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels or {}},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "c", "image": "busybox", "resources": resources}],
                },
            },
        )
        v1.patch_namespaced_pod_status(
            name,
            namespace,
            {
                "status": {
                    "phase": "Running",
                    "conditions": [
                        {"type": "Ready", "status": "True"},
                        {"type": "PodScheduled", "status": "True"},
                    ],
                }
            },
        )
        return name

    def guard_with_pdb(
        self, namespace: str, app: str, *, api_version: str = "policy/v1beta1"
    ) -> None:
        """A PodDisruptionBudget `pdb` (minAvailable 1) over the pods labelled `app`, once
        the disruption controller counts them (start_disruption_controller first): from
        then on an eviction of the one such pod is refused with 429."""
        self.kubectl("apply", "-f", "-", input=f"""
apiVersion: {api_version}
kind: PodDisruptionBudget
metadata: {{name: pdb, namespace: {namespace}}}
spec: {{minAvailable: 1, selector: {{matchLabels: {{app: "{app}"}}}}}}
""")  # fmt: skip
        path = "jsonpath={.status.expectedPods}"
        wait_until(
            lambda: self.kubectl("get", "pdb", "pdb", "-n", namespace, "-o", path).stdout == "1",
            timeout=30, what=f"the PDB over app={app} counting its pod",
        )  # fmt: skip

    def ensure_namespace(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core().create_namespace(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        except ApiException as e:
            if e.status != 409:
                raise

    def ensure_preflight_template(self, namespace: str = "gpuvigil") -> None:
        """The shipped preflight PodTemplate (deploy/kubernetes/preflight) in `namespace`."""
        import yaml
        from kubernetes.client.exceptions import ApiException

        self.ensure_namespace(namespace)
        # The NVIDIA GPU operator's RuntimeClass, which the shipped pods name.
        from kubernetes import client

        try:
            client.NodeV1Api(self.api_client()).create_runtime_class(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "nvidia"},
                    "handler": "nvidia",
                }
            )
        except ApiException as e:
            if e.status != 409:
                raise
        repo = Path(__file__).resolve().parents[2]
        body = yaml.safe_load((repo / "deploy/kubernetes/preflight/podtemplate.yaml").read_text())
        try:
            self.core().create_namespaced_pod_template(namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise

    def run_pods(
        self,
        namespace: str,
        *,
        selector: str,
        node: str,
        exit_code: int = 0,
        message: str = "",
    ) -> list[str]:
        """Play scheduler and kubelet for the unfinished pods matching `selector`: bind
        them to `node` (unless the real scheduler did) and end them with `exit_code` and a
        termination `message`, as the node's kubelet would report it."""
        from datetime import UTC, datetime

        v1 = self.core()
        done = []
        for pod in v1.list_namespaced_pod(namespace, label_selector=selector).items:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            name = pod.metadata.name
            if not pod.spec.node_name:
                v1.create_namespaced_binding(
                    namespace,
                    {
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {"name": name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                    },
                    _preload_content=False,
                )
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            terminated = {
                "exitCode": exit_code,
                "startedAt": now,
                "finishedAt": now,
                "message": message,
                "reason": "Completed" if exit_code == 0 else "Error",
            }
            v1.patch_namespaced_pod_status(
                name,
                namespace,
                {
                    "status": {
                        "phase": "Succeeded" if exit_code == 0 else "Failed",
                        "startTime": now,
                        "containerStatuses": [
                            {
                                "name": pod.spec.containers[0].name,
                                "ready": False,
                                "restartCount": 0,
                                "image": pod.spec.containers[0].image,
                                "imageID": "",
                                "state": {"terminated": terminated},
                            }
                        ],
                    }
                },
            )
            done.append(name)
        return done

    def namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core().create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        return name


def make_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gpuvigil-kube-"))
