"""A real kube-apiserver (v1.20.2, built by scripts/build-kube.sh) with etcd, on loopback.

Nodes and pods exist without kubelets: tests create them and drive their status. New
nodes get the `node.kubernetes.io/not-ready` taint from admission; `create_node` removes it.
Eviction is served as policy/v1beta1 only by this version.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from realparts.procs import Proc, free_port, wait_until

KUBE_BIN = Path(
    os.environ.get("GPUVIGIL_KUBE_BIN", str(Path.home() / ".cache/gpuvigil/k8s-1.20.2"))
)
TOKEN = "gpuvigil-test-admin-token"
# Admins whose writes the API server's audit log records (request bodies included), for
# tests that must know who wrote what, when, by the server's clock (split brain). Everyone
# else is not audited: the log stays small.
AUDITED = tuple(f"gpuvigil-audited-{i}" for i in range(4))
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
    if not (KUBE_BIN / "kube-apiserver").exists():
        return False, f"kube-apiserver not built in {KUBE_BIN} (make kube)"
    for b in ("etcd", "openssl"):
        if shutil.which(b) is None:
            return False, f"{b} not installed"
    return True, ""


class KubeCluster:
    """etcd + kube-apiserver; optional scheduler and disruption controller on demand."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: list[Proc] = []
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = workdir / "kubeconfig"
        self.audit_log = workdir / "audit.log"
        self._extra: dict[str, Proc] = {}

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        d = self.dir
        etcd_port, peer_port = free_port(), free_port()
        self.procs.append(
            Proc(
                [
                    "etcd",
                    "--data-dir", str(d / "etcd"),
                    "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                    "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                    "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
                    "--unsafe-no-fsync",
                ],
                log=d / "etcd.log",
            )
        )  # fmt: skip
        sa_key = d / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
        )
        (d / "tokens.csv").write_text(
            f'{TOKEN},admin,admin,"system:masters"\n'
            + "".join(f'{u}-token,{u},{u},"system:masters"\n' for u in AUDITED)
        )
        (d / "audit-policy.yaml").write_text(AUDIT_POLICY)
        (d / "certs").mkdir(exist_ok=True)
        self.procs.append(
            Proc(
                [
                    str(KUBE_BIN / "kube-apiserver"),
                    "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                    "--bind-address", "127.0.0.1",
                    "--secure-port", str(self.port),
                    "--insecure-port", "0",
                    "--cert-dir", str(d / "certs"),
                    "--token-auth-file", str(d / "tokens.csv"),
                    # As on kubeadm/EKS/GKE clusters: kubelets (system:node:<name>) may
                    # write only their own Node and their own pods' status.
                    "--authorization-mode", "Node,RBAC",
                    "--enable-admission-plugins", "NodeRestriction",
                    "--service-account-key-file", str(sa_key),
                    "--service-account-signing-key-file", str(sa_key),
                    "--service-account-issuer", "https://kubernetes.default.svc",
                    "--api-audiences", "https://kubernetes.default.svc",
                    "--service-cluster-ip-range", "10.96.0.0/24",
                    "--disable-admission-plugins", "ServiceAccount",
                    "--enable-priority-and-fairness=false",
                    "--audit-policy-file", str(d / "audit-policy.yaml"),
                    "--audit-log-path", str(self.audit_log),
                    "--audit-log-maxbackup", "0",
                    # As on every real cluster (kubeadm, EKS, GKE): node agents such as
                    # node-problem-detector and gpuvigil's DaemonSet run privileged.
                    "--allow-privileged=true",
                    "--logtostderr", "--v=0",
                ],
                log=d / "apiserver.log",
            )
        )  # fmt: skip
        self._write_kubeconfig()
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

        def ready() -> bool:
            if not self.procs[-1].alive():
                raise RuntimeError("kube-apiserver exited:\n" + self.procs[-1].log_tail())
            req = urllib.request.Request(
                f"{self.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                return r.status == 200

        wait_until(ready, timeout=60, interval=0.2, what="kube-apiserver /readyz")

    def stop(self) -> None:
        for p in list(self._extra.values()) + self.procs[::-1]:
            p.stop()
        self._extra.clear()

    def _write_kubeconfig(self, path: Path | None = None, token: str = TOKEN) -> Path:
        path = path or self.kubeconfig
        path.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: "{self.url}", insecure-skip-tls-verify: true}}
users:
- name: admin
  user: {{token: "{token}"}}
contexts:
- name: test
  context: {{cluster: test, user: admin}}
current-context: test
"""
        )
        return path

    def audited_kubeconfig(self, user: str) -> Path:
        """A kubeconfig for one of `AUDITED`: its writes are in `audit_events()`."""
        assert user in AUDITED, user
        return self._write_kubeconfig(self.dir / f"kubeconfig-{user}", f"{user}-token")

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
        if "scheduler" not in self._extra:
            self._extra["scheduler"] = Proc(
                [
                    str(KUBE_BIN / "kube-scheduler"),
                    "--kubeconfig", str(self.kubeconfig),
                    "--leader-elect=false", "--port=0", "--secure-port=0",
                ],
                log=self.dir / "scheduler.log",
            )  # fmt: skip

    def start_disruption_controller(self) -> None:
        """kube-controller-manager with only the disruption controller: PDBs give 429."""
        if "kcm" not in self._extra:
            self._extra["kcm"] = Proc(
                [
                    str(KUBE_BIN / "kube-controller-manager"),
                    "--kubeconfig", str(self.kubeconfig),
                    "--controllers=disruption",
                    "--leader-elect=false", "--port=0", "--secure-port=0",
                ],
                log=self.dir / "kcm.log",
            )  # fmt: skip

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
                {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                 "metadata": {"name": "nvidia"}, "handler": "nvidia"})
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
            terminated = {"exitCode": exit_code, "startedAt": now, "finishedAt": now,
                          "message": message, "reason": "Completed" if exit_code == 0 else "Error"}
            v1.patch_namespaced_pod_status(name, namespace, {"status": {
                "phase": "Succeeded" if exit_code == 0 else "Failed",
                "startTime": now,
                "containerStatuses": [{
                    "name": pod.spec.containers[0].name, "ready": False, "restartCount": 0,
                    "image": pod.spec.containers[0].image, "imageID": "",
                    "state": {"terminated": terminated},
                }],
            }})
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
