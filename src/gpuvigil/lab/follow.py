"""What the lab saw, in order: the timeline of one fault through the platform.

`Follower` gathers it from three places, each what an operator would look at:
- the event logs the parts write (the agents' `finding.set`/`finding.cleared`, the
  controller's `node.state`/`remediation`, training's `checkpoint`/`hang`/`job.*`), read
  as they grow;
- the Node objects on the API server (the agent's conditions, gpuvigil's taint, a cordon,
  the preflight result, the agent's remediation answer, the controller's record of an
  isolated GPU, the device plugin's allocatable GPUs), compared pass by pass;
- what the lab itself did (the fault, a reboot carried out, pods started and stopped).
Times are seconds since the fault; entries before it are negative.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvigil.core import wire
from gpuvigil.core.codes import FAMILIES
from gpuvigil.core.events import Kind
from gpuvigil.platform.isolation import ISOLATION_ANNOTATION, decode_isolation

GPU_RESOURCE = "nvidia.com/gpu"

UNHEALTHY_TAINT = wire.UNHEALTHY_TAINT


@dataclass(frozen=True)
class Entry:
    ts: float  # wall clock, seconds since the epoch
    event: str
    node: str | None
    detail: str


@dataclass
class _Tail:
    path: Path
    offset: int = 0

    def lines(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


@dataclass
class Follower:
    events_dir: Path
    entries: list[Entry] = field(default_factory=list)
    fault_ts: float | None = None
    states: dict[str, str] = field(default_factory=dict)  # node -> controller state
    steps: list[tuple[str, str]] = field(default_factory=list)  # (node, ladder step) started
    left_service: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    lost_steps: list[int] = field(default_factory=list)  # from training's job.restart
    last_step: int = 0  # the latest completed step training reported
    resumed_after: float | None = None  # a new attempt started then; its first save says so
    isolated: dict[str, str] = field(default_factory=dict)  # node -> its GPU's isolation step
    gpus_out: int = 0  # the most GPUs out of service at once since the fault (`_out`)
    watched: dict[str, str] = field(default_factory=dict)  # "ns/pod" -> node, followed
    pods_gone: set[str] = field(default_factory=set)  # of `watched`
    unspared: dict[str, float] = field(default_factory=dict)  # node -> spare taint seen lifted
    _tails: dict[Path, _Tail] = field(default_factory=dict)
    _seen: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> last API view
    _preflights: set[tuple[str, str]] = field(default_factory=set)
    _deleting: set[str] = field(default_factory=set)  # of `watched`, deletion seen

    def next_fault(self) -> None:
        """Start the timeline of the next fault of the same lab: what the parts are (node
        states, removed nodes, the logs read so far) carries over; what happened does not."""
        self.entries, self.fault_ts, self.steps = [], None, []
        self.left_service, self.lost_steps = set(), []
        self.last_step, self.resumed_after = 0, None
        self.gpus_out, self.watched, self.pods_gone = 0, {}, set()

    def add(self, event: str, node: str | None, detail: str, ts: float | None = None) -> None:
        self.entries.append(Entry(ts if ts is not None else time.time(), event, node, detail))

    # ---- event logs ---------------------------------------------------------------------

    def read_logs(self) -> None:
        for path in sorted(self.events_dir.glob("*.jsonl")):
            tail = self._tails.setdefault(path, _Tail(path))
            for ev in tail.lines():
                self._event(ev)

    def _event(self, ev: dict[str, Any]) -> None:
        kind, d, node = ev.get("kind"), ev.get("data") or {}, ev.get("node")
        ts = float(ev.get("ts", time.time()))
        if kind == Kind.FINDING_SET and d.get("status") in ("FAILED", "WARNING"):
            self.add("finding", node, f"{d.get('status')} {d.get('code')} on "
                     f"{d.get('component')} (action {d.get('action')})", ts)  # fmt: skip
        elif kind == Kind.FINDING_CLEARED:
            self.add("finding_cleared", node, f"{d.get('code')} on {d.get('component')}", ts)
        elif kind == Kind.NODE_STATE and d.get("from") is not None:
            to = str(d.get("to"))
            self.states[str(node)] = to
            if to != "HEALTHY":
                self.left_service.add(str(node))
            self.add("state", node, f"{d.get('from')} -> {to}: {d.get('reason')}", ts)
        elif kind == Kind.NODE_STATE:
            self.states.setdefault(str(node), str(d.get("to")))
        elif kind == Kind.REMEDIATION and str(d.get("reason", "")).startswith("held: "):
            # the controller held a disruption the node needs (budget, breaker, cooldown)
            self.add("held", node, str(d.get("reason")).removeprefix("held: "), ts)
        elif kind == Kind.REMEDIATION and d.get("result") != "skipped":
            action, result = d.get("action"), d.get("result")
            if result == "started" and action != "DRAIN":
                self.steps.append((str(node), str(action)))
            self.add("remediation", node, f"{action} {result}", ts)
        elif kind == Kind.CHECKPOINT:
            self.last_step = max(self.last_step, int(d.get("step") or 0))
            if self.resumed_after is not None and ts >= self.resumed_after:
                self.resumed_after = None
                self.add("job_resumed", node, f"the restarted job saved step {d.get('step')}", ts)
            self.add("checkpoint", node, f"step {d.get('step')} saved ({d.get('result')}, "
                     f"{d.get('duration_s')} s)", ts)  # fmt: skip
        elif kind == Kind.HANG:
            self.add("hang", node, f"rank {d.get('rank')} at step {d.get('step')} "
                     f"({d.get('where')})", ts)  # fmt: skip
        elif kind == Kind.STARTUP:
            self._ready(node, d, ts)
        elif kind in (Kind.JOB_START, Kind.JOB_RESTART, Kind.JOB_END):
            if kind == Kind.JOB_RESTART and isinstance(d.get("lost_steps"), int):
                self.lost_steps.append(int(d["lost_steps"]))
            brief = ", ".join(f"{k}={v}" for k, v in sorted(d.items()) if k != "nodes")
            where = f" on {', '.join(d['nodes'])}" if isinstance(d.get("nodes"), list) else ""
            self.add(str(kind), node, f"{brief}{where}", ts)

    def _ready(self, node: str | None, d: dict[str, Any], ts: float) -> None:
        """Training's startup: when this attempt's worker started, its group formed, its
        checkpoint was restored, each on its own time (the phases of a restart)."""
        attempt = f"restart count {d.get('attempt')}"  # torchrun's, within this pod
        for event, key, what in (
            ("worker_start", "init_ts", "the worker reached training.init"),
            ("rendezvous", "group_ts", "the process group formed"),
            ("restored", "restored_ts", "the checkpoint restored"),
        ):
            if isinstance(d.get(key), int | float):
                self.add(event, node, f"{attempt}: {what}", float(d[key]))
        self.add("first_step", node, f"{attempt}: step {d.get('step')} done "
                 f"({d.get('first_step_s')} s)", ts)  # fmt: skip

    # ---- the API server ------------------------------------------------------------------

    def read_nodes(self, nodes: list[dict[str, Any]], names: list[str]) -> None:
        present = {n["metadata"]["name"]: n for n in nodes}
        for name in names:
            raw = present.get(name)
            if raw is None:
                if name not in self.gone and name in self._seen:
                    self.gone.add(name)
                    self.add("node_removed", name, "the Node object was deleted (replaced)")
                continue
            self._node(name, raw)
        if self.fault_ts is not None:  # once every node of the pass is read
            self.gpus_out = max(self.gpus_out, self._out())

    def _node(self, name: str, raw: dict[str, Any]) -> None:
        ann = raw["metadata"].get("annotations") or {}
        conds = {
            c["type"]: c
            for c in (raw.get("status") or {}).get("conditions") or []
            if c.get("type") in FAMILIES
        }
        taints = {t.get("key") for t in (raw.get("spec") or {}).get("taints") or []}
        status = raw.get("status") or {}
        iso = decode_isolation(ann.get(ISOLATION_ANNOTATION))
        now = {
            "conditions": {t: (c.get("status"), c.get("reason")) for t, c in conds.items()},
            "blocked": UNHEALTHY_TAINT in taints,
            "spare": wire.SPARE_TAINT in taints,
            "unvalidated": wire.UNVALIDATED_TAINT in taints,
            "request": ann.get(wire.REQUEST_ANNOTATION),
            "result": ann.get(wire.RESULT_ANNOTATION),
            "boot": (status.get("nodeInfo") or {}).get("bootID"),
            "cordoned": bool((raw.get("spec") or {}).get("unschedulable")),
            "isolation": (iso.index, iso.step) if iso is not None else None,
            "why": iso.reason if iso is not None else "",
            "gpus": (_count(status, "capacity"), _count(status, "allocatable")),
        }
        before = self._seen.get(name)
        self._seen[name] = now
        if now["isolation"] is None:
            self.isolated.pop(name, None)
        else:
            self.isolated[name] = str(now["isolation"][1])
        if before is None:
            return
        self._gpu_changes(name, before, now)
        for t, (status, reason) in now["conditions"].items():
            old = before["conditions"].get(t)
            if old is not None and old[0] != status:
                self.add("condition", name, f"{t}={status} ({reason})")
        if now["blocked"] != before["blocked"]:
            verb = "added" if now["blocked"] else "removed"
            self.add(
                "block" if now["blocked"] else "unblock", name, f"taint {UNHEALTHY_TAINT} {verb}"
            )
        if now["spare"] != before["spare"]:
            said = "added: a hot spare" if now["spare"] else "removed: no longer a hot spare"
            if not now["spare"]:
                self.unspared[name] = time.time()
            self.add("spare", name, f"taint {wire.SPARE_TAINT} {said}")
        if now["result"] != before["result"] and now["result"]:
            res = _json(now["result"])
            said = f"{res.get('action')} {res.get('result')}"
            detail = str(res.get("detail") or "")
            self.add("agent", name, (f"{said}: {detail}" if detail and detail != said
                                     else said)[:200])  # fmt: skip
        if now["boot"] != before["boot"]:
            self.add("booted", name, f"new boot id {str(now['boot'])[:8]}")

    def _gpu_changes(self, name: str, before: dict[str, Any], now: dict[str, Any]) -> None:
        """A cordon, the device plugin's allocatable GPUs, the controller's isolation."""
        if now["cordoned"] != before["cordoned"]:
            self.add("cordon" if now["cordoned"] else "uncordon", name, "spec.unschedulable "
                     f"{str(now['cordoned']).lower()}")  # fmt: skip
        (cap, alloc), (_, was) = now["gpus"], before["gpus"]
        if alloc != was:
            self.add("allocatable", name, f"{GPU_RESOURCE} {was} -> {alloc} of {cap} "
                     "(the device plugin's healthy GPUs)")  # fmt: skip
        iso, old = now["isolation"], before["isolation"]
        if iso != old:
            if iso is None:
                self.add("gpu", name, f"gpu:{old[0]} released (the isolation record deleted)")
            else:
                self.add("gpu", name, f"gpu:{iso[0]} {iso[1]}: {now['why']}"[:200])

    def _out(self) -> int:
        """GPUs out of service now: every GPU of a node blocked, cordoned or removed; else
        those the device plugin withholds or the controller isolates."""
        out = 0
        for name, seen in self._seen.items():
            cap, alloc = seen["gpus"]
            if name in self.gone or seen["blocked"] or seen["cordoned"]:
                out += cap or 0
            else:
                withheld = (cap or 0) - alloc if alloc is not None else 0
                out += max(withheld, 1 if seen["isolation"] is not None else 0)
        return out

    def read_pods(self, pods: list[dict[str, Any]]) -> None:
        """The pods the lab follows (`watched`): a deletion asked for (an eviction), and
        the pod gone from the API server."""
        present = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        for key, node in self.watched.items():
            pod = present.get(key)
            if key in self.pods_gone:
                continue
            if pod is None:
                self.pods_gone.add(key)
                self.add("pod_gone", node, f"pod {key} gone from the API server")
            elif pod["metadata"].get("deletionTimestamp") and key not in self._deleting:
                self._deleting.add(key)
                self.add("pod_deleting", node, f"pod {key}: deletion asked for (an eviction)")

    def read_preflight(self, pods: list[dict[str, Any]]) -> None:
        """The controller's preflight pods (one per validation): started, and how each ended
        (its exit status and termination message are the result the controller reads)."""
        for pod in pods:
            meta = pod["metadata"]
            if (meta.get("labels") or {}).get("app.kubernetes.io/name") != "gpuvigil-preflight":
                continue
            name, node = meta["name"], pod["spec"].get("nodeName")
            status = pod.get("status") or {}
            if node and (name, "run") not in self._preflights:
                self._preflights.add((name, "run"))
                self.add("preflight_run", node, f"pod {name} started")
            ended = status.get("phase") in ("Succeeded", "Failed")
            if ended and (name, "end") not in self._preflights:
                self._preflights.add((name, "end"))
                term = {}
                for cs in status.get("containerStatuses") or []:
                    term = (cs.get("state") or {}).get("terminated") or term
                verdict = "pass" if status["phase"] == "Succeeded" else "fail"
                message = str(term.get("message") or "").strip().splitlines()
                self.add("preflight", node, f"{verdict} (exit {term.get('exitCode')})"
                         + (f": {message[-1][:160]}" if message else ""))  # fmt: skip

    def was_spare(self, node: str, since: float) -> bool:
        """The controller's hot-spare taint is on the node (as last read), or was until a
        read after `since`: a pod bound to a spare makes the controller lift it (used),
        which a pass of the lab's may see before the binding."""
        return (
            bool((self._seen.get(node) or {}).get("spare")) or self.unspared.get(node, 0.0) >= since
        )

    def spares(self) -> set[str]:
        """The nodes that carry the controller's hot-spare taint (as last read)."""
        return {n for n, seen in self._seen.items() if (seen or {}).get("spare")}

    def blocked(self, node: str) -> bool:
        """gpuvigil's taint is on the node (as last read)."""
        return bool((self._seen.get(node) or {}).get("blocked"))

    # ---- the result ----------------------------------------------------------------------

    def timeline(self) -> list[dict[str, Any]]:
        t0 = self.fault_ts or (self.entries[0].ts if self.entries else 0.0)
        return [
            {"t_s": round(e.ts - t0, 2), "event": e.event, "node": e.node, "detail": e.detail}
            for e in sorted(self.entries, key=lambda e: e.ts)
        ]


def _count(status: dict[str, Any], field: str) -> int | None:
    text = str((status.get(field) or {}).get(GPU_RESOURCE, ""))
    return int(text) if text.isdigit() else None


def _json(text: str | None) -> dict[str, Any]:
    try:
        v = json.loads(text or "")
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}
