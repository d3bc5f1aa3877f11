"""The lab's training job: a gang of torchrun pods, restarted together, whose retries the
shipped Job's `podFailurePolicy` decides.

Kubernetes 1.20's Job controller predates `podFailurePolicy`, and a torchrun job is a gang
(all ranks restart together, as JobSet or a PyTorchJob does it), so the lab plays that
controller: it creates one pod per rank from the shipped example
(`deploy/kubernetes/examples/training-job.yaml`: its pod template and its podFailurePolicy);
the kube-scheduler places them. When a rank's pod fails, the rest of the gang is stopped
(deleted: SIGTERM, so they save and leave), and once all are gone the next attempt starts on
whichever nodes the scheduler finds. Each failed pod is matched against the policy by
`core.exit_codes.policy_action`, Kubernetes' own algorithm; an attempt is charged to
`backoffLimit` unless one of its failed pods matched an Ignore rule (it caused the gang's
failure; its peers only followed it). A finalizer keeps every pod until its final status
has been read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuvigil.core.exit_codes import policy_action

FINALIZER = "gpuvigil.io/lab-job"
JOB_LABEL = "gpuvigil.io/lab-job"
ATTEMPT_LABEL = "gpuvigil.io/lab-attempt"


def load_example(path: Path) -> dict[str, Any]:
    """The shipped training Job (a mapping), validated enough to be used."""
    job = yaml.safe_load(path.read_text())
    if not isinstance(job, dict) or job.get("kind") != "Job":
        raise ValueError(f"{path}: not a Kubernetes Job")
    return job


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
    stopping: bool = False


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
    port_for: Any  # () -> a free port for each attempt's rendezvous
    # The pods' volumes from the built image: the example's, each of these names given
    # this source instead (the lab has no storage provisioner: its folder stands for the
    # checkpoint claim), and `mounts` added to the trainer. None: the pods run from this
    # machine's Python, where the host's own paths stand in for the mounts.
    volumes: dict[str, dict[str, Any]] | None = None
    mounts: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    counted: int = 0
    state: str = "Running"  # Running | Succeeded | Failed

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
        spec = template["spec"]
        spec.pop("subdomain", None)  # no DNS here: the rendezvous is on loopback
        trainer = spec["containers"][0]
        trainer["args"] = [
            f"--nnodes={self.ranks}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id={self.name}",
            "--max-restarts=0",
            *self.args,
        ]
        keep = [e for e in trainer.get("env") or [] if e["name"] == "NODE_NAME"]
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
        # One rank per node, as GPU requests of a whole node make the scheduler do.
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {JOB_LABEL: self.name, ATTEMPT_LABEL: str(attempt)}},
             "topologyKey": "kubernetes.io/hostname"}]}}  # fmt: skip
        return {"apiVersion": "v1", "kind": "Pod", **template}

    def start_attempt(self, api: Any) -> str:
        number = len(self.attempts) + 1
        port = self.port_for()
        names = []
        for rank in range(self.ranks):
            body = self.pod(number, rank, port)
            api.create_namespaced_pod(self.namespace, body)
            names.append(body["metadata"]["name"])
        self.attempts.append(Attempt(number, names))
        return f"attempt {number} created ({self.ranks} pods)"

    def sync(self, api: Any, pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(event, detail) pairs: scheduled, failed, gang stopped, attempt started, ended."""
        if self.state != "Running" or not self.attempts:
            return []
        out: list[tuple[str, str]] = []
        cur = self.attempts[-1]
        by_name = {p["metadata"]["name"]: p for p in pods}
        for name in cur.pods:
            pod = by_name.get(name)
            if pod is None:
                continue
            node = pod["spec"].get("nodeName")
            if node and name not in cur.nodes:
                cur.nodes[name] = node
                out.append(("job.pod_scheduled", f"{name} on {node}"))
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and name not in cur.exit_codes:
                cur.exit_codes[name] = exit_codes_of(pod)
                if phase == "Failed" and not cur.stopping:
                    action = policy_action(self.policy, pod.get("status") or {})
                    cur.failed[name] = action
                    why = failure_message(pod)
                    out.append(("job.pod_failed", f"{name} on {node}: exit "
                                f"{cur.exit_codes[name]}, podFailurePolicy {action}"
                                + (f": {why}" if why else "")))  # fmt: skip
            if phase in ("Succeeded", "Failed") and FINALIZER in (
                pod["metadata"].get("finalizers") or []
            ):
                _release(api, pod)
        if cur.failed and not cur.stopping:
            cur.stopping = True
            actions = set(cur.failed.values())
            if "FailJob" in actions:
                self.state = "Failed"
                out.append(("job.failed", "a pod matched a FailJob rule"))
            elif "Ignore" not in actions:
                self.counted += 1
            out.append(("job.gang_stopped", f"attempt {cur.number}: "
                        f"{'not counted (Ignore)' if 'Ignore' in actions else 'counted'}; "
                        f"{self.counted}/{self.backoff_limit} of backoffLimit used"))  # fmt: skip
        if cur.stopping:
            for name in cur.pods:  # the whole gang goes, finished pods too (as JobSet does)
                pod = by_name.get(name)
                if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                    _delete(api, self.namespace, name)
        if self.state == "Failed":
            return out
        alive = [n for n in cur.pods if n in by_name]
        if cur.stopping and not alive:
            if self.counted > self.backoff_limit:
                self.state = "Failed"
                out.append(("job.failed", "backoffLimit reached"))
            else:
                out.append(("job.attempt", self.start_attempt(api)))
        elif (
            not cur.stopping
            and len(cur.exit_codes) == len(cur.pods)
            and all(set(c) <= {0} for c in cur.exit_codes.values())
        ):
            self.state = "Succeeded"
            out.append(("job.succeeded", f"attempt {cur.number} finished"))
        return out

    def exit_codes(self) -> list[int]:
        return [c for a in self.attempts for codes in a.exit_codes.values() for c in codes]


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
