"""The lab's training job: one pod per rank from a shipped example, its retries decided by
the example Job's `podFailurePolicy`, in one of two modes.

Kubernetes 1.20's Job controller predates `podFailurePolicy` (and Indexed Jobs), so the lab
plays that controller: it creates one pod per rank from the shipped example (its pod
template and its podFailurePolicy); the kube-scheduler places them. Each failed pod is
matched against the policy by `core.exit_codes.policy_action`, Kubernetes' own algorithm;
a FailJob match ends the job. A finalizer keeps every pod until its final status has been
read.

- `mode="index"` (the default: `training-job-inprocess.yaml`, in-process restart): the Job
  controller of an Indexed Job. A failed rank's pod is replaced alone, by a new pod of the
  same completion index (`batch.kubernetes.io/job-completion-index`, which the example's
  RANK reads); the other ranks' pods are never touched, and their processes re-form the
  group with the replacement (`gpuvigil.training.inprocess`). Each failed pod whose match
  is not Ignore is charged to `backoffLimit`, as Kubernetes counts failed pods. A hang (86)
  or ranks that gave up waiting (93) cannot be cured by one new pod: the whole gang is
  stopped and started again, as in gang mode.
- `mode="gang"` (`training-job.yaml`, torchrun): all ranks restart together, as JobSet or a
  PyTorchJob does it. When a rank's pod fails, the rest of the gang is stopped (deleted:
  SIGTERM, so they save and leave), and once all are gone the next attempt starts on
  whichever nodes the scheduler finds. An attempt is charged to `backoffLimit` unless one
  of its failed pods matched an Ignore rule (it caused the gang's failure; its peers only
  followed it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuvigil.core import exit_codes as codes
from gpuvigil.core.exit_codes import policy_action

FINALIZER = "gpuvigil.io/lab-job"
JOB_LABEL = "gpuvigil.io/lab-job"
ATTEMPT_LABEL = "gpuvigil.io/lab-attempt"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # the Job controller's
# A failure one new pod cannot cure: a hang (its peers may be the stuck ones), or the
# survivors gave up waiting for a replacement; the whole gang starts again.
WHOLE_GANG = frozenset({codes.HANG, codes.RANK_NOT_REPLACED})


def load_manifests(path: Path) -> list[dict[str, Any]]:
    """Every object of a shipped example file (one or several YAML documents)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def load_example(path: Path) -> dict[str, Any]:
    """The shipped training Job (a mapping) of an example file, validated enough to be used."""
    jobs = [d for d in load_manifests(path) if d.get("kind") == "Job"]
    if len(jobs) != 1:
        raise ValueError(f"{path}: not one Kubernetes Job ({len(jobs)} found)")
    return jobs[0]


def exit_codes_of(pod: dict[str, Any]) -> list[int]:
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            out.append(int(term.get("exitCode", 0)))
    return out


def failure_message(pod: dict[str, Any], limit: int = 200) -> str:
    """The last non-blank line of the trainer's termination message (the log's tail, for
    `FallbackToLogsOnError`): why a pod failed, in the timeline, so that a failure nobody
    injected (a rendezvous that lost its port, an import error) explains itself."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        message = ((cs.get("state") or {}).get("terminated") or {}).get("message") or ""
        lines = [line.strip() for line in str(message).splitlines() if line.strip()]
        if lines:
            return lines[-1][-limit:]
    return ""


@dataclass
class Attempt:
    number: int
    pods: list[str]
    nodes: dict[str, str] = field(default_factory=dict)  # pod -> node, once scheduled
    failed: dict[str, str] = field(default_factory=dict)  # pod -> policy action
    exit_codes: dict[str, list[int]] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)  # pod -> its rank (completion index)
    uids: dict[str, str] = field(default_factory=dict)  # pod -> metadata.uid, once seen
    deleted: set[str] = field(default_factory=set)  # pods the lab deleted (stopped)


@dataclass
class GangJob:
    """One training job; `sync` is called with the job's pods on every lab pass and
    returns what happened, for the timeline."""

    name: str
    namespace: str
    example: dict[str, Any]
    ranks: int
    args: list[str]  # the trainer's arguments (the lab's run of the example script)
    env: dict[str, str]
    port_for: Any  # () -> a free port for each attempt's rendezvous (gang mode)
    # The pods' volumes from the built image: the example's, each of these names given
    # this source instead (the lab has no storage provisioner: its folder stands for the
    # checkpoint claim), and `mounts` added to the trainer. None: the pods run from this
    # machine's Python, where the host's own paths stand in for the mounts.
    volumes: dict[str, dict[str, Any]] | None = None
    mounts: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "gang"  # "gang" | "index" (the module's docstring)
    attempts: list[Attempt] = field(default_factory=list)
    current: dict[int, str] = field(default_factory=dict)  # rank -> its pod now
    on_spare: set[str] = field(default_factory=set)  # pods bound to a hot spare (the lab saw)
    counted: int = 0
    stopping: bool = False  # the whole gang is being stopped for the next attempt
    state: str = "Running"  # Running | Succeeded | Failed

    def __post_init__(self) -> None:
        if self.mode not in ("gang", "index"):
            raise ValueError(f"job mode {self.mode!r}: gang or index")

    @property
    def policy(self) -> dict[str, Any] | None:
        return self.example["spec"].get("podFailurePolicy")

    @property
    def backoff_limit(self) -> int:
        return int(self.example["spec"].get("backoffLimit", 6))

    def pod(self, attempt: int, rank: int, port: int) -> dict[str, Any]:
        template = copy.deepcopy(self.example["spec"]["template"])
        meta = template.setdefault("metadata", {})
        meta["name"] = f"{self.name}-a{attempt}-r{rank}"
        meta["namespace"] = self.namespace
        meta["finalizers"] = [FINALIZER]
        meta.setdefault("labels", {}).update({JOB_LABEL: self.name, ATTEMPT_LABEL: str(attempt)})
        meta.setdefault("annotations", {})[INDEX_ANNOTATION] = str(rank)
        spec = template["spec"]
        spec.pop("subdomain", None)  # no DNS here: the rendezvous is on loopback
        trainer = spec["containers"][0]
        if self.mode == "gang":
            trainer["args"] = [
                f"--nnodes={self.ranks}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={self.name}",
                "--max-restarts=0",
                *self.args,
            ]
        else:  # the rank itself: the example's interpreter, the lab's workload
            trainer["command"] = list(trainer.get("command") or ["python"])[:1]
            trainer["args"] = list(self.args)
        keep = [e for e in trainer.get("env") or [] if e["name"] not in self.env]
        trainer["env"] = keep + [{"name": k, "value": v} for k, v in self.env.items()]
        for part in ("limits", "requests"):  # quantities as the API's typed client wants
            res = (trainer.get("resources") or {}).get(part) or {}
            for key in res:
                res[key] = str(res[key])
        if self.volumes is None:
            trainer.pop("volumeMounts", None)
            spec.pop("volumes", None)
        else:
            spec["volumes"] = [{"name": v["name"], **self.volumes[v["name"]]}
                               if v["name"] in self.volumes else v
                               for v in spec.get("volumes") or []]  # fmt: skip
            named = {v["name"] for v in spec["volumes"]}
            spec["volumes"] += [{"name": k, **v} for k, v in self.volumes.items() if k not in named]
            trainer["volumeMounts"] = [*(trainer.get("volumeMounts") or []), *self.mounts]
        # One rank per node, as GPU requests of a whole node make the scheduler do: the
        # attempt's pods (an old attempt's may still be ending), or every pod of the job
        # (index mode: the survivors and the replacement).
        match = {JOB_LABEL: self.name} | ({ATTEMPT_LABEL: str(attempt)} if self.mode == "gang"
                                          else {})  # fmt: skip
        spec["affinity"] = {**(spec.get("affinity") or {}), "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": match},
                 "topologyKey": "kubernetes.io/hostname"}]}}  # fmt: skip
        return {"apiVersion": "v1", "kind": "Pod", **template}

    def _create(self, api: Any, ranks: list[int]) -> Attempt:
        number = len(self.attempts) + 1
        port = self.port_for() if self.mode == "gang" else 0
        attempt = Attempt(number, [])
        for rank in ranks:
            body = self.pod(number, rank, port)
            api.create_namespaced_pod(self.namespace, body)
            name = body["metadata"]["name"]
            attempt.pods.append(name)
            attempt.ranks[name] = rank
            self.current[rank] = name
        self.attempts.append(attempt)
        return attempt

    def start_attempt(self, api: Any) -> str:
        self.stopping = False
        a = self._create(api, list(range(self.ranks)))
        return f"attempt {a.number} created ({self.ranks} pods)"

    def _pods(self) -> list[tuple[Attempt, str]]:
        return [(a, name) for a in self.attempts for name in a.pods]

    def sync(self, api: Any, pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(event, detail) pairs: scheduled, failed, replaced, gang stopped, attempt
        started, ended."""
        if self.state != "Running" or not self.attempts:
            return []
        out: list[tuple[str, str]] = []
        by_name = {p["metadata"]["name"]: p for p in pods}
        failed: list[tuple[Attempt, str, str]] = []  # (attempt, pod, action), new this pass
        for a, name in self._pods():
            pod = by_name.get(name)
            if pod is None:
                continue
            a.uids.setdefault(name, str(pod["metadata"].get("uid", "")))
            node = pod["spec"].get("nodeName")
            if node and name not in a.nodes:
                a.nodes[name] = node
                out.append(("job.pod_scheduled", f"{name} on {node}"))
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and name not in a.exit_codes:
                a.exit_codes[name] = exit_codes_of(pod)
                if phase == "Failed" and not self.stopping:
                    action = policy_action(self.policy, pod.get("status") or {})
                    a.failed[name] = action
                    failed.append((a, name, action))
                    why = failure_message(pod)
                    out.append(("job.pod_failed", f"{name} on {node}: exit "
                                f"{a.exit_codes[name]}, podFailurePolicy {action}"
                                + (f": {why}" if why else "")))  # fmt: skip
            if phase in ("Succeeded", "Failed") and FINALIZER in (
                pod["metadata"].get("finalizers") or []
            ):
                _release(api, pod)
        if failed:
            out += self._failed(api, failed)
        if self.stopping:
            for a, name in self._pods():  # the whole gang goes, finished pods too (as JobSet)
                pod = by_name.get(name)
                if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                    a.deleted.add(name)
                    _delete(api, self.namespace, name)
        if self.state == "Failed":
            return out
        alive = [name for _, name in self._pods() if name in by_name]
        if self.stopping and not alive:
            if self.counted > self.backoff_limit:
                self.state = "Failed"
                out.append(("job.failed", "backoffLimit reached"))
            else:
                out.append(("job.attempt", self.start_attempt(api)))
        elif not self.stopping and self._all_succeeded():
            self.state = "Succeeded"
            out.append(("job.succeeded", f"attempt {self.attempts[-1].number} finished"))
        return out

    def _all_succeeded(self) -> bool:
        ended = {name: c for a in self.attempts for name, c in a.exit_codes.items()}
        return all(name in ended and set(ended[name]) <= {0} for name in self.current.values())

    def _failed(self, api: Any, failed: list[tuple[Attempt, str, str]]) -> list[tuple[str, str]]:
        """What the job does about this pass's failed pods: fail, replace each alone
        (index mode), or stop the gang for the next attempt."""
        actions = {action for _, _, action in failed}
        if "FailJob" in actions:
            self.state, self.stopping = "Failed", True
            return [("job.failed", "a pod matched a FailJob rule")]
        alone = self.mode == "index" and not any(
            set(a.exit_codes[name]) & WHOLE_GANG for a, name, _ in failed
        )
        if not alone:
            self.stopping = True
            if "Ignore" not in actions:
                self.counted += 1
            number = self.attempts[-1].number
            return [("job.gang_stopped", f"attempt {number}: "
                     f"{'not counted (Ignore)' if 'Ignore' in actions else 'counted'}; "
                     f"{self.counted}/{self.backoff_limit} of backoffLimit used")]  # fmt: skip
        out: list[tuple[str, str]] = []
        for a, name, action in failed:
            self.counted += action != "Ignore"
            if self.counted > self.backoff_limit:
                self.state, self.stopping = "Failed", True
                return [*out, ("job.failed", "backoffLimit reached")]
            rank = a.ranks[name]
            new = self._create(api, [rank])
            a.deleted.add(name)
            _delete(api, self.namespace, name)  # its final status read: it holds no node
            out.append(("job.pod_replaced", f"rank {rank}: {new.pods[0]} (attempt {new.number}) "
                        f"replaces {name} ({'not counted' if action == 'Ignore' else 'counted'}; "
                        f"{self.counted}/{self.backoff_limit} of backoffLimit used); "
                        "the other ranks' pods are not touched"))  # fmt: skip
        return out

    def exit_codes(self) -> list[int]:
        return [c for a in self.attempts for codes in a.exit_codes.values() for c in codes]

    def ranks_record(self) -> list[dict[str, Any]]:
        """Each rank's pods in order: the node, uid and exit codes of each, whether the lab
        deleted it; `kept`: its first pod ran to the end (never stopped, never replaced)."""
        out = []
        for rank in range(self.ranks):
            mine = [(a, n) for a, n in self._pods() if a.ranks.get(n) == rank]
            pods = [{"pod": n, "uid": a.uids.get(n), "node": a.nodes.get(n),
                     "exit_codes": a.exit_codes.get(n), "stopped": n in a.deleted}
                    for a, n in mine]  # fmt: skip
            for p in pods:
                p["on_spare"] = p["pod"] in self.on_spare
            kept = len(pods) == 1 and not pods[0]["stopped"] and pods[0]["exit_codes"] == [0]
            moved = [p["node"] for p in pods]
            out.append(
                {
                    "rank": rank,
                    "kept": kept,
                    "pods": pods,
                    "nodes": [n for i, n in enumerate(moved) if not i or n != moved[i - 1]],
                }
            )
        return out


def _release(api: Any, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    left = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
    try:
        # A merge patch replaces the list (a strategic merge would keep what it omits).
        api.patch_namespaced_pod(
            meta["name"],
            meta["namespace"],
            {"metadata": {"finalizers": left}},
            _content_type="application/merge-patch+json",
        )
    except Exception as e:
        if "404" not in str(e):
            raise


def _delete(api: Any, namespace: str, name: str) -> None:
    try:
        api.delete_namespaced_pod(name, namespace)
    except Exception as e:
        if "404" not in str(e):
            raise
