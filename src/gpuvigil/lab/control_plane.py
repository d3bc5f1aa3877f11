"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager (the DaemonSet and Job controllers), for `gpuvigil lab`.

The binaries are the ones `make kube` builds and caches (`~/.cache/gpuvigil/k8s-1.20.2`,
or `$GPUVIGIL_KUBE_BIN`); etcd and openssl come from the system. Flags and their reasons
are in ../shared/REALPARTS.md: token auth for one admin, RBAC, no ServiceAccount admission
(nothing creates the default ServiceAccount), ports picked free at run time.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

from gpuvigil.io.ports import free_port
from gpuvigil.lab.procs import Proc, wait_until

KUBE_BIN = Path(
    os.environ.get("GPUVIGIL_KUBE_BIN", str(Path.home() / ".cache/gpuvigil/k8s-1.20.2"))
)
BINARIES = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")


def missing() -> str | None:
    """Why the control plane cannot start here (one line naming the fix), or None."""
    absent = [b for b in BINARIES if not (KUBE_BIN / b).exists()]
    if absent:
        return f"{', '.join(absent)} not built in {KUBE_BIN}: run `make kube` (builds it once)"
    for tool, package in (("etcd", "etcd-server"), ("openssl", "openssl"),
                          ("kubectl", "kubernetes-client")):  # fmt: skip
        if shutil.which(tool) is None:
            return f"{tool} not installed: run `make system-deps` (Debian {package})"
    return None


def refused(audit_log: Path) -> dict[str, list[str]]:
    """Per user, each distinct request the API server refused (403), as "verb resource"
    (with its subresource and namespace), from an audit log at Metadata level; {} when
    there is no log yet. A line that is not an audit event is skipped."""
    out: dict[str, set[str]] = {}
    try:
        lines = audit_log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return {}
    for line in lines:
        try:
            ev = json.loads(line)
            if ev.get("responseStatus", {}).get("code") != 403:
                continue
            ref = ev.get("objectRef") or {}
            what = "/".join(x for x in (ref.get("resource"), ref.get("subresource")) if x)
            where = f" in {ref['namespace']}" if ref.get("namespace") else ""
            out.setdefault(ev["user"]["username"], set()).add(f"{ev['verb']} {what}{where}")
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return {user: sorted(reqs) for user, reqs in out.items()}


def sa_user(sa: str) -> str:
    """The user name a ServiceAccount's token authenticates as ("namespace:name")."""
    return f"system:serviceaccount:{sa}"


def _sa_token(sa: str) -> str:
    return f"sa-{sa.replace(':', '-')}-token"


def write_kubeconfig(
    path: Path, *, server: str, token: str, context: str, user: str = "admin"
) -> Path:
    """A kubeconfig (mode 0600) of one cluster and one context, both named `context`, and
    one bearer-token `user`; TLS unverified: a loopback API server's self-signed cert."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster: {{server: "{server}", insecure-skip-tls-verify: true}}
users:
- name: {user}
  user: {{token: "{token}"}}
contexts:
- name: {context}
  context: {{cluster: {context}, user: {user}}}
current-context: {context}
"""
    )
    path.chmod(0o600)
    return path


class ControlPlane:
    def __init__(
        self,
        workdir: Path,
        *,
        controllers: str | None = "daemonset,job",
        token: str | None = None,
        context: str = "lab",
        users: tuple[str, ...] = (),
        audit_policy: str | None = None,
        nodes: tuple[str, ...] = (),
        service_accounts: tuple[str, ...] = (),
    ) -> None:
        """`users`: more admins, each with the token `<user>-token`; `audit_policy`: the API
        server's audit policy (its log is `audit_log`), none by default; `nodes`: node
        identities, each with the token `<node>-node-token` as `system:node:<node>` in
        `system:nodes` (who a kubelet's client certificate makes it: the Node authorizer
        and NodeRestriction keep it to its own Node); `service_accounts`: "namespace:name"
        identities, each authenticated as `system:serviceaccount:<namespace>:<name>` in
        its groups (what the account's token makes a pod: RBAC binds the user name, so
        the shipped bindings apply exactly; a static token, since the lab runs no
        ServiceAccount token controller)."""
        self.dir = workdir
        self.controllers = controllers
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.token = token or secrets.token_hex(16)
        self.kubeconfig = workdir / "kubeconfig"
        self.context = context  # the kubeconfig's cluster, user and context name
        self.procs: dict[str, Proc] = {}
        self.users, self.audit_policy, self.nodes = users, audit_policy, nodes
        self.service_accounts = service_accounts
        self.audit_log = workdir / "audit.log"

    def start(self, *, timeout_s: float = 60, scheduler: bool = True) -> None:
        """etcd and the API server (ready when this returns), then the scheduler and the
        controller manager with `controllers` (None: none)."""
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        etcd_port, peer_port = free_port(), free_port()
        self.procs["etcd"] = Proc(
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
            log=d / "logs/etcd.log",
        )  # fmt: skip
        sa_key = d / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(sa_key), "2048"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        (d / "tokens.csv").write_text(
            f'{self.token},admin,admin,"system:masters"\n'
            + "".join(f'{u}-token,{u},{u},"system:masters"\n' for u in self.users)
            + "".join(
                f'{n}-node-token,system:node:{n},system:node:{n},"system:nodes"\n'
                for n in self.nodes
            )
            + "".join(
                f"{_sa_token(sa)},{sa_user(sa)},{sa_user(sa)},"
                f'"system:serviceaccounts,system:serviceaccounts:{sa.split(":")[0]}"\n'
                for sa in self.service_accounts
            )
        )
        audit: list[str] = []
        if self.audit_policy:
            (d / "audit-policy.yaml").write_text(self.audit_policy)
            audit = ["--audit-policy-file", str(d / "audit-policy.yaml"), "--audit-log-path",
                     str(self.audit_log), "--audit-log-maxbackup", "0"]  # fmt: skip
        self.procs["kube-apiserver"] = Proc(
            [
                str(KUBE_BIN / "kube-apiserver"),
                "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                "--bind-address", "127.0.0.1",
                "--secure-port", str(self.port),
                "--insecure-port", "0",
                "--cert-dir", str(d / "certs"),
                "--token-auth-file", str(d / "tokens.csv"),
                # As on kubeadm/EKS/GKE clusters: kubelets (system:node:<name>) may write
                # only their own Node and their own pods' status.
                "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--service-account-key-file", str(sa_key),
                "--service-account-signing-key-file", str(sa_key),
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--api-audiences", "https://kubernetes.default.svc",
                "--service-cluster-ip-range", "10.96.0.0/24",
                "--disable-admission-plugins", "ServiceAccount",
                "--enable-priority-and-fairness=false",
                "--allow-privileged=true",  # the agent DaemonSet runs privileged
                *audit,
                "--logtostderr", "--v=0",
            ],
            log=d / "logs/kube-apiserver.log",
        )  # fmt: skip
        self._write_kubeconfig()
        wait_until(self._ready, timeout=timeout_s, interval=0.2, what="kube-apiserver /readyz")
        if scheduler:
            self.start_scheduler()
        if self.controllers:
            self.start_controllers(self.controllers)

    def _common(self) -> list[str]:
        return [
            "--kubeconfig", str(self.kubeconfig),
            "--leader-elect=false", "--port=0", "--secure-port=0",
        ]  # fmt: skip

    def start_scheduler(self) -> None:
        """The kube-scheduler: it honours NoSchedule taints and `nvidia.com/gpu` capacity."""
        if "kube-scheduler" not in self.procs:
            self.procs["kube-scheduler"] = Proc(
                [str(KUBE_BIN / "kube-scheduler"), *self._common()],
                log=self.dir / "logs/kube-scheduler.log",
            )

    def start_controllers(self, controllers: str) -> None:
        """kube-controller-manager running `controllers` (e.g. "disruption": PDBs 429)."""
        if "kube-controller-manager" not in self.procs:
            self.procs["kube-controller-manager"] = Proc(
                [
                    str(KUBE_BIN / "kube-controller-manager"),
                    *self._common(),
                    f"--controllers={controllers}",
                ],
                log=self.dir / "logs/kube-controller-manager.log",
            )

    def _ready(self) -> bool:
        api = self.procs["kube-apiserver"]
        if not api.alive():
            raise RuntimeError("kube-apiserver exited:\n" + api.log_tail())
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        req = urllib.request.Request(
            f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
            return bool(r.status == 200)

    def kubeconfig_for(self, user: str) -> Path:
        """A kubeconfig for one of `users`."""
        assert user in self.users, user
        return self._write_kubeconfig(self.dir / f"kubeconfig-{user}", f"{user}-token")

    def kubeconfig_for_node(self, node: str) -> Path:
        """A kubeconfig that authenticates as one of `nodes` (`system:node:<node>`)."""
        assert node in self.nodes, node
        return self._write_kubeconfig(self.dir / f"kubeconfig-node-{node}", f"{node}-node-token")

    def kubeconfig_for_service_account(self, sa: str) -> Path:
        """A kubeconfig that authenticates as one of `service_accounts` ("namespace:name")."""
        assert sa in self.service_accounts, sa
        path = self.dir / f"kubeconfig-sa-{sa.replace(':', '-')}"
        return self._write_kubeconfig(path, _sa_token(sa))

    def _write_kubeconfig(self, path: Path | None = None, token: str | None = None) -> Path:
        return write_kubeconfig(
            path or self.kubeconfig, server=self.url, token=token or self.token,
            context=self.context,
        )  # fmt: skip

    def dead(self) -> list[str]:
        """Components that exited (the lab stops rather than follow a broken cluster)."""
        return [name for name, p in self.procs.items() if not p.alive()]

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd"):
            p = self.procs.pop(name, None)
            if p is not None:
                p.stop(timeout=10)
