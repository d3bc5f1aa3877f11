"""One lab run: start the parts; then for each fault, run a job, inject the fault, follow
it to the end.

`Lab(config, faults=[...], on=..., workdir=...).run()` returns a `LabResult` per fault (the
timeline, the ladder steps taken, every node's final state, the job's outcome and what
`gpuvigil report --json` computes from the event logs written while that fault ran). The
faults run one after another on the same parts, each once every node is back in service,
so several cost one start. Everything it starts is stopped by PID when it returns, also on
errors and Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from gpuvigil.core.config import deep_merge
from gpuvigil.io.ports import free_port
from gpuvigil.lab import episode, faults, serving
from gpuvigil.lab.alerting import HEALTHY_WATCH_S, RULES_DEFAULT, AlertPath
from gpuvigil.lab.config import LabConfig
from gpuvigil.lab.control_plane import ControlPlane, refused, sa_user
from gpuvigil.lab.follow import Follower
from gpuvigil.lab.image import Image
from gpuvigil.lab.image import missing as image_missing
from gpuvigil.lab.jobs import JOB_LABEL, GangJob
from gpuvigil.lab.kubelet import APP_LABEL, PREFLIGHT_APP, Kubelet
from gpuvigil.lab.machine import GPUS, SRC, Machine, python_env
from gpuvigil.lab.parts import (
    EXAMPLES,
    JOB,
    apply_shipped,
    cluster_prerequisites,
    store_argv,
    training_job,
    trust_key,
)
from gpuvigil.lab.procs import Proc
from gpuvigil.lab.result import (
    LabResult,
    ettr_of,
    figures,
    job_record,
    log_offsets,
    report,
    slice_logs,
)
from gpuvigil.platform.state import POOL_LABEL

REPO = SRC.parent
POOL = "lab"
# Who the controller is, as the shipped Deployment makes it ("namespace:name")
CONTROLLER_SA = "gpuvigil:gpuvigil-controller"
CONTROLLER_POD = "gpuvigil-controller-lab"  # its pod's name ($(POD_NAME): its lease identity)
CONTROLLER_KUBECONFIG = "/etc/gpuvigil/kubeconfig"  # in its pod (the account's token)


def audit_policy(users: list[str]) -> str:
    """The API server records every request of gpuvigil's own identities (the lab's admin
    emulation and fault injection are not gpuvigil's, and would bury them)."""
    return yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": users}, {"level": "None"}],
    })  # fmt: skip


class LabError(RuntimeError):
    """The lab could not run (a part missing or dead); the message says which."""


class Lab:
    def __init__(
        self,
        config: LabConfig,
        *,
        faults: list[str],
        on: str | None,
        workdir: Path,
        progress: Any = None,
        alerts: bool = False,
        image: bool = True,
        workload: str = "training",
    ) -> None:
        check_faults(faults)
        # --workload serving: an inference Deployment beside the job (lab/serving.py)
        self.serving: serving.Serving | None = None
        self.workload = workload
        if workload == "serving":
            config = serving.configure(config)
        elif config.spares:  # the lost rank's hot spare (the serving replicas tolerate none)
            spares = {"spares": {"pools": {POOL: config.spares}}}
            config = config.model_copy(update={"controller": deep_merge(spares, config.controller)})
        self.cfg, self.faults, self.on = config, faults, on
        self.fault, self.target = faults[0], on
        self.dir = workdir
        self.events = workdir / "events"
        self.names = [f"lab-gpu-{i}" for i in range(1, config.nodes + 1)]
        if on is not None and on not in self.names:
            raise LabError(f"--on {on!r}: the lab's nodes are {', '.join(self.names)}")
        # The parts talk as the shipped deploy makes them: the controller as its
        # ServiceAccount, each agent as its node (deploy/kubernetes/node-identity), under the
        # shipped RBAC; only the lab's own emulation and fault injection use the admin.
        self.identities = {"controller": sa_user(CONTROLLER_SA)} | {
            f"agent {n}": f"system:node:{n}" for n in self.names
        }
        self.cp = ControlPlane(
            workdir / "cluster",
            nodes=tuple(self.names),
            service_accounts=(CONTROLLER_SA,),
            audit_policy=audit_policy(sorted(set(self.identities.values()))),
            controllers=serving.controllers(workload),
        )
        self.machines: dict[str, Machine] = {}
        self.kubelets: dict[str, Kubelet] = {}
        self.controller: Proc | None = None
        # image: the controller runs from the built image (lab/image.py), when it is built
        self.want_image = image
        self.image: Image | None = None
        # containers run from the image on machines gone back to the provider, by app
        self.gone_from_image: Counter[str] = Counter()
        self.follow = Follower(self.events)
        self.job: GangJob | None = None
        self.store: Proc | None = None  # the in-process job's store server
        self._created = 0.0  # when the job's latest pods were created (time.time())
        self.api: Any = None
        self.t_start = time.monotonic()
        self._progress = progress  # (message) -> None: what the lab is doing, for people
        self._trust, self._trust_at = "", 0.0  # the controller's public key, as last copied
        self.hits: list[str] = []  # the nodes broken so far, in order
        # --alerts: Prometheus and Alertmanager on the shipped rules (lab/alerting.py)
        self.alerting = AlertPath(workdir / "alerting", rules=RULES_DEFAULT) if alerts else None
        self.controller_metrics = f"127.0.0.1:{free_port()}" if alerts else ""
        self.watched_from = 0.0  # when Prometheus began watching (time.time())
        # The lab's own counts since it started, for the dashboard's panels to match
        self.counts: dict[str, dict[str, float]] = {"xid_by_code": {}, "remediations": {}}

    def say(self, message: str) -> None:
        if self._progress is not None:
            self._progress(f"[{time.monotonic() - self.t_start:6.1f}s] {message}")

    # ---- start ---------------------------------------------------------------------------

    def start(self) -> None:
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # self-signed
        self.events.mkdir(parents=True, exist_ok=True)
        self.say("starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager")
        self.cp.start()
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(str(self.cp.kubeconfig)))
        cluster_prerequisites(self.api)
        self.say("applying deploy/kubernetes with kubectl (its RBAC governs the parts)")
        try:
            apply_shipped(self.cp.kubeconfig, REPO / "deploy/kubernetes")
        except RuntimeError as e:
            raise LabError(str(e)) from e
        shipped = yaml.safe_load((REPO / "deploy/kubernetes/agent/agent.yaml").read_text())
        agent_cfg = deep_merge(shipped, self.cfg.agent)
        if self.want_image:
            why = image_missing()
            if why:
                self.say(f"{why}; the parts run from the host's Python")
            else:
                self.say("opening the built image (the controller and the agents run from it)")
                try:
                    self.image = Image.open()
                except RuntimeError as e:
                    raise LabError(str(e)) from e
                stale = self.image.differs()
                if stale:
                    raise LabError(
                        f"{self.image.tag} holds other code than this checkout ({len(stale)} "
                        f"files, e.g. {', '.join(stale[:3])}): run `make image`, or --no-image"
                    )
        self.say(f"registering {len(self.names)} GPU nodes, starting their agents")
        pool_label = self.cfg.controller.get("safety", {}).get("pool_label", POOL_LABEL)
        for name in self.names:
            m = Machine(
                name,
                self.dir / "machines" / name,
                kubeconfig=self.cp.kubeconfig_for_node(name),
                agent_config=agent_cfg,
                agent_restart_s=self.cfg.agent_restart_s,
                env=self.cfg.preflight_env,
                events_dir=self.events,
            )
            if self.alerting is not None:  # before create(): it writes the agent's config
                m.http_listen = f"127.0.0.1:{free_port()}"
            m.image = self.image
            m.create()
            self.machines[name] = m
            k = Kubelet(m, self.api, pods_dir=self.dir / "pods",
                        skip_xids=self.cfg.device_plugin_skip_xids)  # fmt: skip
            k.register(labels={"nvidia.com/gpu.present": "true", pool_label: POOL},
                       taints=[])  # fmt: skip
            self.kubelets[name] = k
            m.start_agent()
        self._start_controller()
        if self.alerting is not None:
            self.say("starting Prometheus (the shipped rules) and Alertmanager")
            try:
                self.alerting.start(
                    agents=[str(m.http_listen) for m in self.machines.values()],
                    controller=self.controller_metrics,
                )
            except RuntimeError as e:
                raise LabError(str(e)) from e
            self.watched_from = time.time()
        self._until(self._agents_published, 90, "every agent's first health summary")
        self.say("every agent has published; the controller runs")
        if self.workload == "serving":  # once every node is there: the scheduler spreads it
            self.say("creating the serving Deployment, its PDB and its HPA")
            self.serving = serving.Serving(self.api.api_client)
            self.serving.start()

    def _start_controller(self) -> None:
        kubeconfig = self.cp.kubeconfig_for_service_account(CONTROLLER_SA)
        pod = self._controller_pod(kubeconfig) if self.image is not None else None
        cfg = deep_merge(
            {
                "cluster": "kubernetes",
                "events_path": str(self.events / "controller.jsonl"),
                # the site's pool of 8-GPU machines, as its operator states it: preflight
                # validates that many GPUs whatever a node's status says (docs/security.md)
                "kubernetes": {
                    "kubeconfig": str(kubeconfig) if pod is None else CONTROLLER_KUBECONFIG,
                    "pool_gpus": {POOL: GPUS},
                },
            },
            self.cfg.controller,
        )
        if self.controller_metrics:
            host, port = self.controller_metrics.rsplit(":", 1)
            cfg.update(metrics_address=host, metrics_port=int(port))
        path = self.dir / "controller.yaml" if pod is None else pod / "config.yaml"
        path.write_text(yaml.safe_dump({"controller": cfg}))
        argv = [sys.executable, "-m", "gpuvigil", "controller", "--config", str(path)]
        if pod is not None:
            assert self.image is not None
            argv = self._in_image(pod)
        self.controller = Proc(argv, log=self.dir / "logs/controller.log", env=python_env())

    def _controller_pod(self, kubeconfig: Path) -> Path:
        """The controller pod's volumes on the host: its config folder (the ConfigMap, at
        /etc/gpuvigil, with its account's kubeconfig beside it) owned by the pod's user,
        and the lab's event folder open to it as /tmp is (every part appends there)."""
        uid = self._controller_container()[1]["uid"]
        pod = self.dir / "controller-pod"
        pod.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kubeconfig, pod / "kubeconfig")
        for f in (pod, pod / "kubeconfig"):
            os.chown(f, uid, uid)
        pod.chmod(0o700)
        self.events.chmod(0o1777)
        return pod

    @staticmethod
    def _controller_container() -> tuple[dict[str, Any], dict[str, Any]]:
        """The shipped Deployment's controller container, and what its pod's and its own
        securityContext ask of the runtime (`Image.security`: uid, gid, ...)."""
        doc = yaml.safe_load((REPO / "deploy/kubernetes/controller/deployment.yaml").read_text())
        spec = doc["spec"]["template"]["spec"]
        container = spec["containers"][0]
        security = Image.security(spec.get("securityContext") or {},
                                  container.get("securityContext") or {})  # fmt: skip
        return container, security

    def _in_image(self, pod: Path) -> list[str]:
        """The controller as the Deployment starts it: the image's entrypoint with the
        container's args and env, as its securityContext's user, with its read-only root,
        its ConfigMap mounted where the args name it."""
        assert self.image is not None
        container, security = self._controller_container()
        env = {"POD_NAME": CONTROLLER_POD}
        args = [a.replace("$(POD_NAME)", CONTROLLER_POD) for a in container["args"]]
        binds = [(str(pod), "/etc/gpuvigil", True), (str(self.events), str(self.events), False)]
        return self.image.argv(["gpuvigil", *args], binds=binds, env=env, **security)

    def parts(self) -> list[dict[str, Any]]:
        """Each gpuvigil part: who it was to the API server, what it ran from, and every
        request of it the API server refused so far (the audit log: a verb the code uses
        and the shipped RBAC lacks). Preflight makes no API call; its pods run on the
        machines as the controller built them."""
        denied = refused(self.cp.audit_log)
        parts = [
            {
                "name": name,
                "identity": who,
                **self._runs_from(name),
                "refused": denied.get(who, []),
            }
            for name, who in self.identities.items()
        ]
        # preflight's pods and the training job's: no API identity (no token mounted);
        # `runs` counts the containers the kubelets started from the image so far
        runs = sum((k.from_image for k in self.kubelets.values()), self.gone_from_image)
        if self.image is not None:
            parts.append({"name": "preflight", "identity": None, **self._runs_from("preflight"),
                          "refused": [], "runs": runs[PREFLIGHT_APP]})  # fmt: skip
        if self.job is not None:
            app = self.job.example["spec"]["template"]["metadata"]["labels"][APP_LABEL]
            parts.append({"name": "training job", "identity": None,
                          **self._runs_from("training job"), "refused": [],
                          "runs": runs[app]})  # fmt: skip
        return parts

    def _runs_from(self, part: str) -> dict[str, Any]:
        if self.image is not None:
            return {"image": f"{self.image.tag}@{self.image.digest}", "runs_from": "image"}
        return {"image": None, "runs_from": sys.prefix}  # the host's Python and this code

    def _agents_published(self) -> bool:
        from gpuvigil.core import wire

        for name in self.names:
            ann = self.api.read_node(name).metadata.annotations or {}
            if wire.HEALTH_ANNOTATION not in ann:
                return False
        return True

    def start_job(self, name: str, *, gpus: int | None = None) -> None:
        example = REPO / "deploy/kubernetes/examples" / EXAMPLES[self.cfg.restart]
        store = None
        if self.cfg.restart == "in-process":
            store = self._start_store(example, name)
        self.job = training_job(
            example,
            self.cfg,
            name=name,
            events=self.events,
            checkpoints=self.dir / "checkpoints",
            image=self.image is not None,
            gpus=gpus,
            store=store,
        )
        self._created = time.time()
        self.follow.add("job", None, self.job.start_attempt(self.api))
        how = "one pod per rank, in-process restart" if store else "torchrun, gang restart"
        self.say(f"training job started (2 ranks: {how})")

    def _start_store(self, example: Path, name: str) -> str:
        """The job's store server (the example's Deployment), once it listens: host:port."""
        if self.store is not None:
            self.store.stop()
        port = free_port()
        self.store = Proc(store_argv(example, port=port), log=self.dir / f"logs/store-{name}.log",
                          env=python_env())  # fmt: skip
        store = self.store

        def listening() -> bool:
            if not store.alive():
                raise LabError(f"the job's store server exited:\n{store.log_tail()}")
            return "serving on" in store.log_tail()

        self._until(listening, 60, "the job's store server")
        self.follow.add(
            "job", None, f"store server listening on 127.0.0.1:{port} (pid {store.pid})"
        )
        return f"127.0.0.1:{port}"

    # ---- the loop ------------------------------------------------------------------------

    def tick(self) -> None:
        dead = self.cp.dead()
        if dead:
            raise LabError(f"{', '.join(dead)} exited; see {self.cp.dir / 'logs'}")
        if self.controller is not None and not self.controller.alive():
            raise LabError(f"gpuvigil controller exited:\n{self.controller.log_tail()}")
        if self.alerting is not None:
            gone = self.alerting.dead()
            if gone:
                raise LabError(f"{', '.join(gone)} exited; see {self.alerting.dir}")
            self.alerting.poll()
        pods = json.loads(self.api.list_pod_for_all_namespaces(_preload_content=False).data)
        by_node: dict[str, list[dict[str, Any]]] = {n: [] for n in self.kubelets}
        for pod in pods.get("items") or []:
            node = pod["spec"].get("nodeName")
            if node in by_node:
                by_node[node].append(pod)
        for name, kubelet in self.kubelets.items():
            if name in self.follow.gone:
                continue
            kubelet.sync(by_node[name])
            m = kubelet.machine
            if m.reboot_requested():
                self.follow.add("reboot", name, "the machine reboots (its processes die)")
                kubelet.reboot()
            elif m.tend_agent():
                self.follow.add("agent_restart", name, "the agent was started again")
        self.follow.read_preflight(pods.get("items") or [])
        self.follow.read_pods(pods.get("items") or [])
        if self.serving is not None:
            for event, detail in self.serving.sync(pods.get("items") or []):
                self.follow.add(event, None, detail)
        if self.job is not None:
            name = self.job.name
            mine = [p for p in pods.get("items") or []
                    if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == name]  # fmt: skip
            for event, said in self.job.sync(self.api, mine):
                detail = said
                if event == "job.pod_scheduled":  # "<pod> on <node>"
                    pod, _, node = said.partition(" on ")
                    if self.follow.was_spare(node, self._created):
                        self.job.on_spare.add(pod)
                        detail += " (a hot spare)"
                self.follow.add(event, None, detail)
                if event in ("job.attempt", "job.pod_replaced"):
                    self.follow.resumed_after = self._created = time.time()
        self._sync_trust()
        nodes = json.loads(self.api.list_node(_preload_content=False).data)
        self.follow.read_nodes(nodes.get("items") or [], self.names)
        for name in list(self.follow.gone):
            k = self.kubelets.pop(name, None)
            if k is not None:  # the machine went back to the provider
                self.gone_from_image += k.from_image
                k.stop()
                k.machine.stop()
        self.follow.read_logs()

    def _sync_trust(self) -> None:
        """The kubelet's refresh of a ConfigMap volume: every machine's copy of the
        controller's public key, which its agent verifies requests with."""
        now = time.monotonic()
        if now - self._trust_at < 2.0:
            return
        self._trust_at = now
        key = trust_key(self.api)
        if key and key != self._trust:
            self._trust = key
            for m in self.machines.values():
                m.set_trust(key)
            self.follow.add("trust", None, "the controller's public key reached the machines")

    def _until(self, pred: Any, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.tick()
            if pred():
                return
            time.sleep(0.2)
        raise LabError(f"timed out after {timeout:g} s waiting for {what}")

    # ---- the fault -----------------------------------------------------------------------

    def wait_for_progress(self) -> None:
        """Until the job has saved its first checkpoint and run half an interval more, so a
        fault finds work both saved and not yet saved."""
        job = self.job
        assert job is not None
        self._until(lambda: self.follow.last_step >= self.cfg.checkpoint_every, 240,
                    "the job's first checkpoint")  # fmt: skip
        half = self.cfg.checkpoint_every * self.cfg.step_ms / 2000
        end = time.monotonic() + half
        if self.alerting is not None:
            # A healthy lab must be watched long enough to show a rule that fires on it.
            end = max(end, time.monotonic() + HEALTHY_WATCH_S - (time.time() - self.watched_from))
        while time.monotonic() < end:
            self.tick()
            time.sleep(0.1)

    def follow_to_end(self, started: float) -> bool:
        end = started + self.cfg.timeout_s
        while time.monotonic() < end:
            self.tick()
            if episode.settled(self):
                return True
            time.sleep(0.2)
        return False

    # ---- the end -------------------------------------------------------------------------

    def wait_for_alerts_to_resolve(self) -> None:
        """After the fault settled: until every alert that fired has its resolution
        delivered (bounded by alert_resolve_s; one still open is reported open)."""
        a = self.alerting
        if a is None:
            return
        end = time.monotonic() + self.cfg.alert_resolve_s
        while time.monotonic() < end and a.open_alerts():
            self.tick()
            time.sleep(0.2)

    def dashboard(self) -> dict[str, Any]:
        """The Xid-by-code and remediation panels of deploy/grafana/gpuvigil.json, queried
        from the lab's Prometheus, next to the lab's own counts since it started."""
        import re

        a = self.alerting
        assert a is not None
        for e in self.follow.timeline():
            if e["event"] == "remediation":
                c = self.counts["remediations"]
                key = "action={},result={}".format(*e["detail"].split(" ", 1))
                c[key] = c.get(key, 0) + 1
            elif e["event"] == "fault" and (
                m := re.search(r"NVRM: Xid \([^)]*\): (\d+)", e["detail"])
            ):
                c = self.counts["xid_by_code"]
                c[f"code={m.group(1)}"] = c.get(f"code={m.group(1)}", 0) + 1
        panels = json.loads((REPO / "deploy/grafana/gpuvigil.json").read_text())["panels"]
        expr = {p["title"]: p["targets"][0]["expr"] for p in panels if p.get("targets")}
        return {
            "panels": {
                "xid_by_code": a.panel(expr["Xid heat map (events per code per hour)"]),
                "remediations": a.panel(expr["Remediations by action and result (per hour)"]),
            },
            "lab": {k: dict(v) for k, v in self.counts.items()},
        }

    def stop(self) -> None:
        if self.store is not None:
            self.store.stop()
        if self.alerting is not None:
            self.alerting.stop()
        for k in self.kubelets.values():
            k.stop()
        if self.controller is not None:
            self.controller.stop()
        if self.image is not None:
            self.image.close()
        for m in self.machines.values():
            m.stop()
        self.cp.stop()

    def final_state(self) -> dict[str, str]:
        from gpuvigil.platform.state import STATE_ANNOTATION, decode_record

        out = {}
        for name in self.names:
            if name in self.follow.gone:
                out[name] = "REMOVED"
                continue
            ann = self.api.read_node(name).metadata.annotations or {}
            rec = decode_record(ann.get(STATE_ANNOTATION))
            out[name] = rec.state.value if rec is not None else "HEALTHY"
        return out

    def run(self) -> list[LabResult]:
        """Each fault's result, in order; a fault that did not settle is the last one run
        (the next would not find the lab as the first did)."""
        results: list[LabResult] = []
        try:
            self.start()
            for index, fault in enumerate(self.faults):
                result = self.run_fault(index, fault)
                results.append(result)
                if not (result.settled and result.job["finished"]):
                    break
        finally:
            self.stop()
        return results

    def run_fault(self, index: int, fault: str) -> LabResult:
        started = self.t_start if index == 0 else time.monotonic()
        if index:
            self.say(f"waiting for every node to be back in service before {fault}")
            self._until(
                lambda: episode.in_service(self), self.cfg.timeout_s, "every node back in service"
            )
            self.follow.next_fault()
        self.fault, self.target = fault, None
        offsets = log_offsets(self.events)
        # one GPU's fault: the job leaves a GPU of each node to the holder the fault hits
        per_gpu = faults.KINDS[fault].per_gpu
        self.start_job(JOB if index == 0 else f"{JOB}-{index + 1}",
                       gpus=GPUS - 1 if per_gpu else None)  # fmt: skip
        self.wait_for_progress()
        if self.serving is None and self.cfg.spares and self.cfg.restart == "in-process":
            # the last fault's spare took a rank and its node was repaired since: the next
            # fault's lost rank must find the spare the controller refills, not a race with it
            self._until(lambda: bool(self.follow.spares()), 120, "the controller's hot spare")
        if self.serving is not None:
            self._until(self.serving.all_ready, 120, "every serving replica Ready")
            self.serving.measure()
        try:
            gpu = episode.place_holder(self, f"gpu-holder-{index + 1}") if per_gpu else 3
            episode.inject(self, gpu=gpu)
        except episode.EpisodeError as e:
            raise LabError(str(e)) from e
        settled = self.follow_to_end(started)
        self.wait_for_alerts_to_resolve()
        dashboard = self.dashboard() if self.alerting is not None else None
        final = self.final_state()
        self.follow.read_logs()
        job, f = self.job, self.follow
        assert job is not None and self.target is not None
        logs = slice_logs(self.events, offsets, self.dir / "faults" / f"{index + 1}-{fault}")
        reported = report(logs)
        return LabResult(
            fault=fault,
            node=self.target,
            timeline=f.timeline(),
            remediation_steps=[s for n, s in f.steps if n == self.target],
            final_state=final,
            job=job_record(job, f.lost_steps) | {"ettr": ettr_of(reported)},
            report=reported,
            figures=figures(f.timeline(), self.target, gpus_out=f.gpus_out),
            settled=settled,
            duration_s=time.monotonic() - started,
            workdir=str(self.dir),
            parts=self.parts(),
            serving=None if self.serving is None else self.serving.record(),
            alerts=None if self.alerting is None else self.alerting.take(f.fault_ts or 0.0),
            dashboard=dashboard,
            alerts_watched_before_fault_s=(
                None if self.alerting is None else round((f.fault_ts or 0.0) - self.watched_from, 1)
            ),
        )


def interrupt_on_terminate() -> None:
    """Make SIGTERM and SIGHUP end the lab as Ctrl-C does. Their default action kills the
    process before `Lab.run`'s `finally`, which leaves the lab's API server, etcd, agents
    and pods running; a KeyboardInterrupt unwinds through it and stops them."""

    def interrupt(sig: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(sig).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def check_faults(kinds: list[str]) -> None:
    """Raise LabError unless `kinds` can run in this order on one lab."""
    problem = faults.order_problem(kinds)
    if problem:
        raise LabError(problem)


def cleanup(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
