"""One emulated GPU machine of the lab: its fake hardware, its kernel log, its boot, and
its `gpuvigil agent` process.

A machine is a folder: `nvml.json` (the fake NVML scenario, `gpuvigil.fakes.gpu`), `root/`
(a fake sysfs tree with `proc/sys/kernel/random/boot_id`), `kern.log` (the kernel log the
agent follows), `bin/` (the node's `nvidia-smi`, `systemctl` and `nsenter`: small scripts
that run `gpuvigil.lab.fake_tools`, so the agent's shipped remediation commands act on the
fakes), `state/` (the agent's state folder) and `run/report.json` (the agent's state file,
which the training health gate reads, as through the DaemonSet's hostPath).

What a machine does that needs no kubelet: boot (a new boot id, a fresh kernel log with the
driver's load line), reboot (on the request `systemctl reboot` leaves in `reboot-requested`:
every process of the machine dies, `fakes.faults.reboot` repairs what a reboot repairs, and
it boots again), and run its agent (restarted after it dies, as the DaemonSet's kubelet
restarts a container, after `agent_restart_s`).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from gpuvigil.fakes import faults as fake_faults
from gpuvigil.fakes.gpu import SCENARIO_ENV, FakeNode, make_node
from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.lab.image import IMAGE_PYTHON, Image
from gpuvigil.lab.procs import Proc

GPUS = 8
SRC = Path(__file__).resolve().parents[2]  # the `src` folder this gpuvigil runs from
TOOLS = ("nvidia-smi", "systemctl", "nsenter")


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process the lab starts: this checkout's gpuvigil first."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # The lab's API server has a self-signed certificate: one warning per request is noise.
    env["PYTHONWARNINGS"] = "ignore:Unverified HTTPS request"
    env.update(extra or {})
    return env


def _socket_path(path: Path) -> Path:
    """`path`, or a short one in the temporary folder when `path` is past what a unix
    socket's address holds (108 bytes with its NUL; a deep lab folder gets there)."""
    if len(str(path)) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="gpuvigil-lab-")) / path.name


class Machine:
    def __init__(
        self,
        name: str,
        folder: Path,
        *,
        kubeconfig: Path,
        agent_config: dict[str, Any],
        agent_restart_s: float = 2.0,
        env: dict[str, str] | None = None,
        events_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.dir = folder
        self.kubeconfig = kubeconfig
        self.agent_config = agent_config
        self.agent_restart_s = agent_restart_s
        self.env = dict(env or {})  # settings every gpuvigil process on the machine gets
        self.root = folder / "root"
        self.scenario = folder / "nvml.json"
        self.kmsg = folder / "kern.log"
        self.bin = folder / "bin"
        self.state_file = folder / "run" / "report.json"
        self.reboot_marker = folder / "reboot-requested"
        self.trust_file = folder / "trust" / "controller.pub"
        self.pod_resources_socket = _socket_path(folder / "pod-resources" / "kubelet.sock")
        self.events_file = (events_dir or folder / "events") / f"agent-{name}.jsonl"
        self.boot_id = ""
        self.booted_mono = time.monotonic()
        self.boots = 0
        self.agent: Proc | None = None
        # HOST:PORT of the agent's /metrics when the lab runs Prometheus (`--alerts`); off
        # otherwise (the shipped port would be one for every agent of the lab).
        self.http_listen: str | None = None
        self.agent_starts = 0
        self._agent_down_since: float | None = None
        self.hold_agent = False  # the lab stopped it on purpose (it stays down)
        self.image: Image | None = None  # the agent runs from it when set (lab/image.py)

    # ---- the hardware -------------------------------------------------------------------

    def create(self) -> None:
        for sub in ("run", "state", "logs", "bin"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        FakeSysfs.node(self.root, gpus=GPUS, kind="ib", adapters=0)
        make_node(GPUS).save(self.scenario)
        for tool in TOOLS:
            script = self.bin / tool
            # The same tool for a process of the host (preflight's pods) and for the agent
            # in the image's root, where this Python is absent and the image's is the
            # same code (lab/image.py refuses another).
            script.write_text(
                f'#!/bin/sh\nPY="{sys.executable}"\n[ -x "$PY" ] || PY={IMAGE_PYTHON}\n'
                f'exec "$PY" -m gpuvigil.lab.fake_tools {tool} "$@"\n'
            )
            script.chmod(0o755)
        (self.dir / "agent.yaml").write_text(yaml.safe_dump(self._agent_yaml()))
        self.boot()

    def host_env(self) -> dict[str, str]:
        """What every process on this machine sees of it (what a pod on the real machine
        would see through its devices, mounts and service account). A pod reaches the
        machine's folders (its hostPath mounts) through `$(GPUVIGIL_LAB_MACHINE)`."""
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            SCENARIO_ENV: str(self.scenario),
            "GPUVIGIL_LAB_MACHINE": str(self.dir),
            "GPUVIGIL__NODE__GPU__NVML_MODULE": "gpuvigil.fakes.nvml",
            "GPUVIGIL__NODE__EXPECT_GPUS": str(GPUS),
            "KUBECONFIG": str(self.kubeconfig),
            **self.env,
        }

    def fake_node(self) -> FakeNode:
        return FakeNode.load(self.scenario)

    def save(self, node: FakeNode) -> None:
        node.save(self.scenario)

    def uptime_s(self) -> float:
        return time.monotonic() - self.booted_mono

    def log_kernel(self, message: str) -> str:
        """Append one kernel-log line stamped with the uptime, as the kernel prints it."""
        line = f"[{self.uptime_s():12.6f}] {message}"
        with self.kmsg.open("a") as fh:
            fh.write(line + "\n")
        return line

    def boot(self) -> None:
        """A fresh boot: new boot id, an empty kernel log but for the boot lines."""
        self.boots += 1
        self.boot_id = str(uuid.uuid4())
        rand = self.root / "proc/sys/kernel/random"
        rand.mkdir(parents=True, exist_ok=True)
        (rand / "boot_id").write_text(self.boot_id + "\n")
        (self.root / "proc/stat").write_text(f"btime {int(time.time())}\n")
        # The kernel and the driver came up just now: later lines are stamped after both
        # (an Xid stamped before the driver's load line would read as cured by that load).
        self.booted_mono = time.monotonic() - 2.0
        self.kmsg.write_text(
            "[    0.000000] Linux version 6.1.0-lab (gpuvigil lab)\n"
            "[    1.210000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07\n"
        )

    def reboot_requested(self) -> bool:
        return self.reboot_marker.exists()

    def reboot(self) -> None:
        """Everything on the machine dies, the hardware gets what a reboot repairs, and it
        boots again; the caller (the kubelet) restarts the pods, this restarts the agent."""
        self.reboot_marker.unlink(missing_ok=True)
        self.stop_agent(signal.SIGKILL)
        node = fake_faults.reboot(self.fake_node())
        for g in node.gpus:
            g.xids.clear()  # the driver's pending events go with it
        self.save(node)
        self.boot()
        self.start_agent()

    # ---- the agent ----------------------------------------------------------------------

    def _agent_yaml(self) -> dict[str, Any]:
        cfg = yaml.safe_load(yaml.safe_dump(self.agent_config))  # a deep copy
        agent = cfg.setdefault("agent", {})
        agent.update(
            {
                "node_name": self.name,
                "sysfs_root": str(self.root),
                "state_dir": str(self.dir / "state"),
                "events_file": str(self.events_file),
                "kernel_log": {
                    **agent.get("kernel_log", {}),
                    "source": "file",
                    "file": str(self.kmsg),
                },
            }
        )
        sinks = agent.setdefault("sinks", {})
        sinks.setdefault("state_file", {})["path"] = str(self.state_file)
        http = sinks.setdefault("http", {})
        http["enabled"] = self.http_listen is not None
        if self.http_listen is not None:
            http["listen"] = self.http_listen
        kube = sinks.setdefault("kubernetes", {})
        kube["kubeconfig"] = str(self.kubeconfig)
        # The DaemonSet mounts the ConfigMap gpuvigil-trust here (`set_trust` copies it).
        kube.setdefault("trust", {})["controller_public_key_file"] = str(self.trust_file)
        # The kubelet's PodResources socket (the DaemonSet mounts its folder): the lab kubelet's.
        kube.setdefault("pod_resources", {})["socket"] = str(self.pod_resources_socket)
        kube.setdefault("remediation", {})["boot_id_path"] = str(
            self.root / "proc/sys/kernel/random/boot_id"
        )
        node = cfg.setdefault("node", {})
        node.setdefault("gpu", {})["nvml_module"] = "gpuvigil.fakes.nvml"
        node["expect_gpus"] = GPUS
        return cfg

    def start_agent(self) -> None:
        self.agent_starts += 1
        args = ["agent", "--config", str(self.dir / "agent.yaml"), "--log-level", "info"]
        env = {**self.host_env(), "NODE_NAME": self.name}
        argv = [sys.executable, "-m", "gpuvigil", *args]
        if self.image is not None:
            argv = self._in_image(["gpuvigil", *args], env)
        self.agent = Proc(argv, log=self.dir / "logs" / f"agent-{self.agent_starts}.log",
                          env=python_env(env))  # fmt: skip
        self._agent_down_since = None

    def _in_image(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """The agent as its DaemonSet starts it, from the image: the container's user and
        root, the machine's folders (its hostPath volumes, at the paths its config names)
        and its node's kubeconfig as volumes, the image's PATH after the machine's tools."""
        assert self.image is not None
        doc = yaml.safe_load((SRC.parent / "deploy/kubernetes/agent/daemonset.yaml").read_text())
        spec = doc["spec"]["template"]["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == "agent"]
        security = self.image.security(spec.get("securityContext") or {},
                                       container.get("securityContext") or {})  # fmt: skip
        binds = [(str(self.dir), str(self.dir), False),
                 (str(self.events_file.parent), str(self.events_file.parent), False),
                 (str(self.kubeconfig), str(self.kubeconfig), True)]  # fmt: skip
        sock = self.pod_resources_socket.parent
        if not sock.is_relative_to(self.dir):
            binds.append((str(sock), str(sock), False))
        inner = {**env, "PATH": f"{self.bin}{os.pathsep}{self.image.env.get('PATH', '/usr/bin')}"}
        return self.image.argv(argv, binds=binds, env=inner, **security)

    def stop_agent(self, sig: int = signal.SIGTERM) -> None:
        if self.agent is not None:
            self.agent.stop(sig, timeout=10)

    def kill_agent(self) -> None:
        """The agent dies (the `agent-stop` fault): SIGKILL, no goodbye on the Node."""
        if self.agent is not None:
            self.agent.kill_all()

    def tend_agent(self) -> bool:
        """Restart a dead agent after `agent_restart_s` (a DaemonSet container's restart).
        Returns True when it restarted it now."""
        if self.agent is None or self.agent.alive() or self.hold_agent:
            return False
        now = time.monotonic()
        if self._agent_down_since is None:
            self._agent_down_since = now
        if now - self._agent_down_since < self.agent_restart_s:
            return False
        self.start_agent()
        return True

    def set_trust(self, public_key: str) -> None:
        """The controller's public key, where the agent reads it (a ConfigMap volume)."""
        self.trust_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.trust_file.with_suffix(".tmp")
        tmp.write_text(public_key)
        tmp.replace(self.trust_file)

    def agent_report(self) -> dict[str, Any] | None:
        try:
            import json

            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def stop(self) -> None:
        self.hold_agent = True
        self.stop_agent()
