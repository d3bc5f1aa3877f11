"""The lab's kubelet: runs the pods bound to one machine as processes and reports them.

What it does, as the kubelet would: registers the Node (Ready, GPU capacity, the boot id in
`status.nodeInfo.bootID`); for each pod bound to the node, runs its init containers in
order, then its containers, and writes the pod's status (Running and Ready, then Succeeded
or Failed with each container's exit code); restarts containers of `restartPolicy: Always`
pods; on deletion (an eviction, a delete) sends SIGTERM to each container's first process,
waits the pod's grace period, then kills everything the container started, writes the
final status and removes the pod (which waits for its finalizers, as on a real cluster);
after a reboot, runs the pods again from their init containers.

Its device manager, as the kubelet's with NVIDIA's device plugin: a pod's `nvidia.com/gpu`
limits are given whole GPUs at admission (the fake NVML's UUIDs, lowest index first, in
`NVIDIA_VISIBLE_DEVICES`), freed when the pod ends, and listed on the PodResources API
(`fakes.pod_resources`, a real gRPC server on `machine.pod_resources_socket`), which the
machine's agent reads to publish which pod holds which GPU. Only the GPUs the device plugin
(`lab.device_plugin`) calls healthy are given out and counted in the Node's allocatable;
its capacity counts all of them.

A container is a process on the machine (`machine.Machine.host_env`): `gpuvigil ...` and
`python ...` run this checkout's Python; an image with no command (the pause image) is a
container that does nothing until it is stopped.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuvigil.fakes.pod_resources import PodResourcesServer
from gpuvigil.lab.device_plugin import DevicePlugin
from gpuvigil.lab.machine import GPUS, Machine, python_env
from gpuvigil.lab.procs import Proc, running

GPU_RESOURCE = "nvidia.com/gpu"
APP_LABEL = "app.kubernetes.io/name"
PREFLIGHT_APP = "gpuvigil-preflight"  # the PodTemplate's app.kubernetes.io/name

SMP = "application/strategic-merge-patch+json"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodRun:
    """One pod's containers on this machine: which one runs, and how each ended."""

    namespace: str
    name: str
    spec: dict[str, Any]
    init_done: int = 0  # init containers finished successfully
    procs: dict[str, Proc | None] = field(default_factory=dict)  # running; None: pause
    exits: dict[str, int] = field(default_factory=dict)
    terminating_since: float | None = None
    phase: str = "Pending"
    reported: str = ""  # the last status written (no repeated writes)
    finished: bool = False  # final status written, pod deleted (or left for its owner)
    gpus: dict[str, list[str]] | None = None  # container -> GPU UUIDs; None: not admitted
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def holds(self) -> bool:
        """It holds its GPUs: admitted and not ended (a pod that ran to completion, whose
        object stays, frees them, as the kubelet's device manager does)."""
        return bool(self.gpus) and not self.finished and self.phase not in ("Succeeded", "Failed")


class Kubelet:
    def __init__(
        self, machine: Machine, api: Any, *, pods_dir: Path, skip_xids: tuple[int, ...] = ()
    ) -> None:
        self.machine = machine
        self.api = api  # kubernetes.client.CoreV1Api
        self.node = machine.name
        self.pods_dir = pods_dir
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.pod_resources = PodResourcesServer(machine.pod_resources_socket)
        # containers started from the built image, by their pod's app.kubernetes.io/name
        self.from_image: Counter[str] = Counter()
        self.plugin = DevicePlugin(machine, skip_xids=skip_xids)

    # ---- the Node ---------------------------------------------------------------------

    def register(self, *, labels: dict[str, str], taints: list[dict[str, str]]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {"kubernetes.io/hostname": self.node, **labels},
            },
            "spec": {"taints": taints},
        }
        self.api.create_node(body)
        self.pod_resources.start()
        self.plugin.start()
        self.report_node()
        # Admission adds node.kubernetes.io/not-ready; the node lifecycle controller that
        # lifts it does not run here (no heartbeats), so the kubelet lifts it once Ready.
        node = self.api.read_node(self.node)
        keep = [
            {"key": t.key, "value": t.value, "effect": t.effect}
            for t in node.spec.taints or []
            if not t.key.startswith("node.kubernetes.io/")
        ]
        self.api.patch_node(self.node, {"spec": {"taints": keep}})

    def report_node(self) -> None:
        cap = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: str(GPUS)}
        uuids = [g.uuid for g in self.machine.fake_node().gpus]
        alloc = {**cap, GPU_RESOURCE: str(len(self.plugin.healthy(uuids)))}
        status = {
            "capacity": cap,
            "allocatable": alloc,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "gpuvigil lab kubelet",
                    "lastHeartbeatTime": now_iso(),
                    "lastTransitionTime": now_iso(),
                }
            ],
            "nodeInfo": {"bootID": self.machine.boot_id},
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node},
            ],
        }
        self.api.patch_node_status(self.node, {"status": status}, _content_type=SMP)

    # ---- pods -------------------------------------------------------------------------

    def sync(self, pods: list[dict[str, Any]]) -> None:
        """One pass over the pods bound to this node (raw JSON from a pod list)."""
        if self.plugin.check():  # a GPU went Unhealthy: allocatable drops, as ListAndWatch
            self.report_node()
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta["uid"]
            seen.add(uid)
            run = self.runs.get(uid)
            done = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
            if (run is None and done) or (run is not None and run.finished):
                if meta.get("deletionTimestamp"):  # nothing runs: confirm the deletion
                    self._delete(PodRun(meta["namespace"], meta["name"], pod["spec"]))
                continue
            if run is None:
                run = self.runs[uid] = PodRun(
                    meta["namespace"],
                    meta["name"],
                    pod["spec"],
                    labels=meta.get("labels") or {},
                    annotations=meta.get("annotations") or {},
                )
            for proc in run.procs.values():
                if proc is not None:
                    proc.remember(every_s=1.0)
            if meta.get("deletionTimestamp"):
                self._terminate(run, grace=meta.get("deletionGracePeriodSeconds"))
            else:
                self._advance(run)
            self._report(run)
        for uid in [u for u in self.runs if u not in seen]:
            self._kill(self.runs.pop(uid))  # deleted outright (grace 0): nothing to report
        self.pod_resources.set_pods(
            {(r.namespace, r.name): {c: {GPU_RESOURCE: ids} for c, ids in r.gpus.items()}
             for r in self.runs.values() if r.holds}
        )  # fmt: skip

    def _admit(self, run: PodRun) -> None:
        """Give each container the GPUs its limits ask for (whole GPUs, lowest index free
        first); a finished or deleted pod's GPUs are free again."""
        held = {u for r in self.runs.values() if r.holds for u in
                (i for ids in r.gpus.values() for i in ids)}  # fmt: skip
        uuids = self.plugin.healthy(g.uuid for g in self.machine.fake_node().gpus)
        free = [u for u in uuids if u not in held]
        run.gpus = {}
        for c in [*(run.spec.get("initContainers") or []), *(run.spec.get("containers") or [])]:
            want = str(((c.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE, "0"))
            n = int(want) if want.isdigit() else 0
            if n:
                run.gpus[c["name"]], free = free[:n], free[n:]

    def _advance(self, run: PodRun) -> None:
        if run.gpus is None:
            self._admit(run)
        inits = run.spec.get("initContainers") or []
        always = run.spec.get("restartPolicy", "Always") == "Always"
        while run.init_done < len(inits):
            c = inits[run.init_done]
            proc = run.procs.get(c["name"])
            if c["name"] not in run.procs:
                run.procs[c["name"]] = self._start(run, c)
                return
            if proc is not None and proc.alive():
                return
            code = _code(proc)
            if proc is not None:
                proc.kill_all()
            run.exits[c["name"]] = code
            del run.procs[c["name"]]
            if code != 0:
                if run.spec.get("restartPolicy") == "Never":
                    run.phase = "Failed"
                    run.finished = True
                return  # Always/OnFailure: started again on the next pass
            run.init_done += 1
        for c in run.spec.get("containers") or []:
            name = c["name"]
            if name not in run.procs and name not in run.exits:
                run.procs[name] = self._start(run, c)
            proc = run.procs.get(name)
            code = _code(proc) if proc is not None and not proc.alive() else None
            if code is not None and proc is not None:
                proc.kill_all()  # the container ends with its first process: all of it goes
                run.exits[name] = code
                del run.procs[name]
                if always:
                    run.exits.pop(name)  # restarted on the next pass
        main = [c["name"] for c in run.spec.get("containers") or []]
        if all(n in run.exits for n in main):
            run.phase = "Succeeded" if all(run.exits[n] == 0 for n in main) else "Failed"
        else:
            run.phase = "Running"

    def _start(self, run: PodRun, c: dict[str, Any]) -> Proc | None:
        argv = [*(c.get("command") or []), *(c.get("args") or [])]
        if not argv:
            return None  # the pause image: nothing to run
        from_image = self._from_image(c)
        if not from_image:  # in the image, its PATH finds its own gpuvigil and python
            if argv[0] == "gpuvigil":
                argv = [sys.executable, "-m", "gpuvigil", *argv[1:]]
            elif argv[0] in ("python", "python3"):
                argv = [sys.executable, *argv[1:]]
        env = python_env(self.machine.host_env())
        if run.gpus and c["name"] in run.gpus:
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(run.gpus[c["name"]])
        for item in c.get("env") or []:
            env[item["name"]] = _expand(self._env_value(run, item), env)
        folder = self.pods_dir / f"{run.namespace}_{run.name}"
        # The termination-message file is a mount of a file of the pod's own: a process
        # here sees the machine's /dev, so its path in the arguments becomes that file.
        message = c.get("terminationMessagePath") or "/dev/termination-log"
        argv = [str(folder / f"{c['name']}.termination-log") if a == message else a for a in argv]
        if from_image:
            argv = self._in_image(run, c, argv, env, folder)
            self.from_image[run.labels.get(APP_LABEL, "")] += 1
        return Proc(argv, log=folder / f"{c['name']}.log", env=env)

    def _from_image(self, c: dict[str, Any]) -> bool:
        """A container of gpuvigil's image (preflight's, the training job's) runs from the
        built image when the lab has it; any other image stands for itself on the host."""
        image = self.machine.image
        repository = str(c.get("image", "")).split(":")[0]
        return image is not None and repository == image.tag.split(":")[0]

    def _in_image(self, run: PodRun, c: dict[str, Any], argv: list[str], env: dict[str, str],
                  folder: Path) -> list[str]:  # fmt: skip
        """The container as a runtime starts it: the image's root, the pod's and the
        container's securityContext (user, read-only root, capabilities, no_new_privs), its
        volumes (`_volumes`), its /etc/hosts and its termination-message file, and the
        machine (its devices: the fakes' files, read-only)."""
        image = self.machine.image
        assert image is not None
        security = image.security(run.spec.get("securityContext") or {},
                                  c.get("securityContext") or {})  # fmt: skip
        log = folder / f"{c['name']}.termination-log"
        folder.mkdir(parents=True, exist_ok=True)
        log.touch()
        os.chown(log, security["uid"], security["gid"])
        # The kubelet's own /etc/hosts for the pod (an image has none: torchrun's
        # rendezvous resolves localhost and this host's name, which is the pod's here,
        # no UTS namespace giving it the pod's own).
        hosts = folder / "etc-hosts"
        hosts.write_text("# Kubernetes-managed hosts file (the lab's kubelet)\n"
                         "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                         f"127.0.0.1\t{run.name} {socket.gethostname()}\n")  # fmt: skip
        binds = [(str(self.machine.dir), str(self.machine.dir), True),
                 (str(hosts), "/etc/hosts", True),
                 *self._volumes(run, c, folder, security), (str(log), str(log), False)]  # fmt: skip
        inner = {k: v for k, v in env.items() if k not in ("PYTHONPATH",)}
        inner["PATH"] = f"{self.machine.bin}{os.pathsep}{image.env.get('PATH', '/usr/bin')}"
        return image.argv(argv, binds=binds, env=inner, **security)

    def _volumes(self, run: PodRun, c: dict[str, Any], folder: Path,
                 security: dict[str, Any]) -> list[tuple[str, str, bool]]:  # fmt: skip
        """The container's volumeMounts as binds (host folder, mountPath, read-only): an
        emptyDir is a folder of the pod's own, owned by its user (as fsGroup would make
        it); a hostPath is the machine's folder standing for that path of the node
        (`node_path`), or a folder of the lab's own as it is. Any other volume, or a
        hostPath the machine has no stand-in for, fails the container's start, as a
        mount that fails does."""
        volumes = {v["name"]: v for v in run.spec.get("volumes") or []}
        out = []
        for mount in c.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "emptyDir" in volume:
                host = folder / "volumes" / mount["name"]
                host.mkdir(parents=True, exist_ok=True)
                group = (run.spec.get("securityContext") or {}).get("fsGroup", security["gid"])
                os.chown(host, security["uid"], int(group))
            elif "hostPath" in volume:
                host = self.node_path(volume["hostPath"]["path"])
            else:
                raise RuntimeError(f"pod {run.name}: volume {mount['name']}: the lab's kubelet "
                                   f"mounts emptyDir and hostPath only")  # fmt: skip
            out.append((str(host), mount["mountPath"], bool(mount.get("readOnly"))))
        return out

    def node_path(self, path: str) -> Path:
        """The host folder standing for a node's `path` (a hostPath volume's): the
        machine's `run` for /run/gpuvigil (the agent's report, where its DaemonSet's
        hostPath puts it), its `state` for /var/lib/gpuvigil; a folder of the lab's own
        work folder (the lab's stand-in for a shared volume) as it is."""
        stand_in = {"/run/gpuvigil": self.machine.state_file.parent,
                    "/var/lib/gpuvigil": self.machine.dir / "state"}  # fmt: skip
        if path in stand_in:
            return stand_in[path]
        lab = self.pods_dir.parent
        if Path(path).is_relative_to(lab) and Path(path).exists():
            return Path(path)
        raise RuntimeError(f"hostPath {path}: no such folder on the lab's machine {self.node}")

    def _message(self, run: PodRun, c: dict[str, Any], code: int) -> str:
        """What the kubelet puts in `terminated.message`: the termination-message file (at
        most 4096 bytes), else, for `FallbackToLogsOnError` and a failure, the log's tail."""
        folder = self.pods_dir / f"{run.namespace}_{run.name}"
        try:
            text = (folder / f"{c['name']}.termination-log").read_bytes()[-4096:]
        except OSError:
            text = b""
        if not text and code != 0 and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                text = (folder / f"{c['name']}.log").read_bytes()[-2048:]
            except OSError:
                text = b""
        return text.decode(errors="replace")

    def _env_value(self, run: PodRun, item: dict[str, Any]) -> str:
        if "value" in item:
            return str(item["value"])
        path = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        # metadata.annotations['k'] / metadata.labels['k'] (an Indexed Job's RANK reads
        # its completion index so)
        m = re.fullmatch(r"metadata\.(annotations|labels)\['([^']+)'\]", path)
        if m:
            return (run.annotations if m.group(1) == "annotations" else run.labels).get(
                m.group(2), ""
            )
        return {
            "spec.nodeName": self.node,
            "metadata.name": run.name,
            "metadata.namespace": run.namespace,
            "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
        }.get(path, "")

    def _terminate(self, run: PodRun, *, grace: int | None) -> None:
        if run.terminating_since is None:
            run.terminating_since = time.monotonic()
            for proc in run.procs.values():
                if proc is not None:
                    proc.send(signal.SIGTERM)  # to the container's first process
        left = [p for p in run.procs.values() if p is not None and p.alive()]
        waited = time.monotonic() - run.terminating_since
        if left and waited < float(grace if grace is not None else 30):
            return
        self._kill(run)
        for name, proc in list(run.procs.items()):
            run.exits[name] = _code(proc)
        run.procs.clear()
        main = [c["name"] for c in run.spec.get("containers") or []]
        ok = all(run.exits.get(n, 137) == 0 for n in main)
        run.phase = "Succeeded" if ok else "Failed"
        self._report(run)
        run.finished = True
        self._delete(run)

    def _kill(self, run: PodRun) -> None:
        for proc in run.procs.values():
            if proc is not None:
                proc.stop(signal.SIGKILL, timeout=5)

    def _delete(self, run: PodRun) -> None:
        try:
            self.api.delete_namespaced_pod(run.name, run.namespace, grace_period_seconds=0)
        except Exception as e:
            if "404" not in str(e):
                raise

    def _report(self, run: PodRun) -> None:
        statuses = []
        for c in run.spec.get("containers") or []:
            name = c["name"]
            if name in run.exits:
                code = run.exits[name]
                state = {"terminated": {"exitCode": code, "message": self._message(run, c, code),
                                        "reason": "Completed" if code == 0
                                        else "Error", "finishedAt": now_iso()}}  # fmt: skip
            elif name in run.procs:
                state = {"running": {"startedAt": now_iso()}}
            else:
                state = {"waiting": {"reason": "PodInitializing"}}
            statuses.append({"name": name, "state": state, "ready": "running" in state,
                             "restartCount": 0, "image": c.get("image", ""),
                             "imageID": "", "containerID": ""})  # fmt: skip
        key = f"{run.phase}:{[(s['name'], next(iter(s['state']))) for s in statuses]}"
        if key == run.reported:
            return
        ready = "True" if run.phase == "Running" and all(s["ready"] for s in statuses) else "False"
        status = {
            "phase": run.phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": now_iso()}],
            "containerStatuses": statuses,
        }
        try:
            self.api.patch_namespaced_pod_status(
                run.name, run.namespace, {"status": status}, _content_type=SMP
            )
            run.reported = key
        except Exception as e:
            if "404" not in str(e):
                raise
            run.finished = True

    # ---- a reboot ---------------------------------------------------------------------

    def reboot(self) -> None:
        """The machine reboots: every container dies with it; pods that restart run again
        from their init containers, the others fail; the Node reports the new boot id."""
        for run in self.runs.values():
            if run.finished:
                continue
            self._kill(run)
            if run.spec.get("restartPolicy", "Always") == "Never":
                for name in run.procs:
                    run.exits[name] = 137
                run.procs.clear()
                run.phase = "Failed"
                self._report(run)
                run.finished = True
            else:
                run.procs.clear()
                run.exits.clear()
                run.init_done = 0
                run.gpus = None  # admitted again after the boot
        self.machine.reboot()
        self.plugin.restart()  # its pod starts again with the machine: every GPU healthy
        self.report_node()

    def stop(self) -> None:
        for run in self.runs.values():
            self._kill(run)
        self.pod_resources.stop()


def _expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(NAME)` references to variables defined before (`$$` escapes)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        value,
    )


def _code(proc: Proc | None) -> int:
    if proc is None:
        return 0  # the pause container stops cleanly
    code = proc.returncode()
    if code is None:
        return 137
    return 128 - code if code < 0 else code  # death by signal N reads 128 + N


def gpus_of(kubelet: Kubelet, namespace: str, name: str) -> list[int]:
    """The indexes of the GPUs a pod on this node was given ([] before its admission)."""
    mine = [r for r in kubelet.runs.values() if (r.namespace, r.name) == (namespace, name)]
    run = next((r for r in mine if r.holds), None)
    held = {u for ids in (run.gpus or {}).values() for u in ids} if run and run.gpus else set()
    return [g.index for g in kubelet.machine.fake_node().gpus if g.uuid in held]


def ranks_on(kubelet: Kubelet) -> list[int]:
    """The training ranks (workers, not torchrun) running in the job's pods on a node: the
    container's first process itself when it is the rank (in-process mode, from this
    machine's Python), else below it."""
    out: list[int] = []
    for run in kubelet.runs.values():
        proc = run.procs.get("trainer")
        if proc is not None and not run.finished:
            launchers = set(running(b"gpuvigil.training.launch", proc.pid))
            found = [p for p in running(b"gpuvigil.lab.workload", proc.pid) if p not in launchers]
            out += found or ([proc.pid] if _cmdline_has(proc.pid, b"gpuvigil.lab.workload")
                             and not _cmdline_has(proc.pid, b"gpuvigil.training.launch")
                             else [])  # fmt: skip
    return out


def _cmdline_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
