"""The Slurm adapter: `Cluster` over scontrol / sinfo / squeue (22.05+), run only through
`io.exec.run` (argv lists, timeouts).

Called by the controller (`gpuvigil controller --cluster slurm`), `gpuvigil nodes` and
`gpuvigil release`. Mapping:

- every command goes through the one Slurm client, `io.slurm_client` (the agent's too);
- read: `sinfo --json` (state, flags, reason, comment, extra, boot time) and
  `squeue --json` (running jobs per node); `scontrol --json` does not exist in 22.05;
- health: the agent's summary in the node field `core.wire.SLURM_HEALTH_FIELD` (Extra);
- record: gpuvigil's JSON record in the node's Comment; the drain reason is the short tag
  `gpuvigil:<state>:<step>:<code>`, which is how a drain is known to be ours. A drain (or a
  DOWN) with any other reason is someone else's: gpuvigil never RESUMEs it nor rewrites it;
- block = `State=DRAIN Reason=<tag>`; unblock = `State=RESUME`, only when the reason is ours;
- drain running work: wait for jobs, and at the deadline `scontrol requeue` the batch jobs
  that allow it (`drain_mode: requeue`, the infrastructure-failure path: the job keeps its
  id and runs again elsewhere) and `scancel` the rest; or requeue at once
  (`requeue_at_once`). A gang job requeued while the spare reservation holds an idle
  spare keeps its surviving nodes and starts on them plus a spare
  (`clusters.slurm_spares`, `follow_spare_moves` on each controller pass);
- reboot (and reset, which Slurm has no per-GPU channel for): `scontrol reboot ASAP
  nextstate=RESUME reason=<tag> NODE`. Because the reason is not Slurm's own "Reboot ASAP",
  Slurm keeps the DRAIN after the reboot, so the node stays blocked until it validates.
  Success = the reboot flags are gone and BootTime is newer than the request.
- version: Slurm has no resourceVersion and no conditional update, so a node's version is a
  digest of the fields gpuvigil reads (state, flags, reason, comment, extra, boot time);
  `store` reads the node just before writing and raises Conflict when the digest moved,
  which narrows a lost update to the one scontrol call after that read;
- every write (scontrol update/reboot/requeue, scancel, the replace hook) asks `fence`
  first; the lease lives in files (`clusters.slurm_lease`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from gpuvigil.core import wire
from gpuvigil.core.findings import Action
from gpuvigil.io import exec as execp
from gpuvigil.io.slurm_client import SlurmClient, SlurmError
from gpuvigil.io.slurm_conf import expand_hostlist
from gpuvigil.platform.clusters.base import (
    AgentResult,
    Conflict,
    DrainStatus,
    Fence,
    Forbidden,
    NodeView,
    Record,
    Unavailable,
    unfenced,
)
from gpuvigil.platform.clusters.settings import SlurmSettings
from gpuvigil.platform.clusters.slurm_degrade import PREFIX as GPU_REASON
from gpuvigil.platform.clusters.slurm_degrade import Degrader, Progress
from gpuvigil.platform.clusters.slurm_isolation import SlurmIsolation
from gpuvigil.platform.clusters.slurm_lease import FileLease
from gpuvigil.platform.clusters.slurm_spares import SlurmSpares, held_nodes
from gpuvigil.platform.state import (
    DEFAULT_POOL,
    POOL_LABEL,
    TAG_PREFIX,
    Intent,
    State,
    decode_record,
    parse_tag,
)

REBOOT_FLAGS = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}
RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"}
# what a write by gpuvigil, its agent or a person changes (load and memory figures do not)
VERSIONED = ("state", "state_flags", "reason", "comment", "extra", "boot_time", "partitions")
WRITES = {
    "update",
    "reboot",
    "requeue",
    "reconfigure",
    "create",
    "delete",
}  # scontrol subcommands that change something


def version_of(raw: dict[str, Any]) -> str:
    """The node's version token: a digest of the fields in VERSIONED."""
    text = json.dumps([raw.get(k) for k in VERSIONED], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _epoch(v: Any) -> datetime | None:
    if isinstance(v, dict):  # newer Slurm: {"set": true, "number": N}
        v = v.get("number") if v.get("set", True) else None
    return datetime.fromtimestamp(v, UTC) if isinstance(v, int | float) and v > 0 else None


def _flags(raw: dict[str, Any]) -> set[str]:
    state = raw.get("state")
    states = state if isinstance(state, list) else [state or ""]
    return {str(s).upper() for s in [*states, *(raw.get("state_flags") or [])]}


def _pool(raw: dict[str, Any]) -> str | None:
    """A Slurm node's pool is its first partition (budgets are per pool)."""
    parts = raw.get("partitions") or []
    return str(parts[0]) if parts else None


def facts(raw: dict[str, Any]) -> dict[str, str]:
    """What the circuit breaker may group findings by: the node's features (the whole set,
    and each `key=value` one as an attribute), its kernel and its slurmd version."""
    feats = raw.get("active_features") or raw.get("features") or []
    names = sorted({str(f).strip() for f in (feats.split(",") if isinstance(feats, str) else feats)
                    if str(f).strip()})  # fmt: skip
    out = {"features": ",".join(names)} if names else {}
    for f in names:
        key, sep, value = f.partition("=")
        if sep and key and value:
            out[key] = value
    os_name = str(raw.get("operating_system") or "").split()
    if len(os_name) >= 2:  # "Linux 5.15.0-91-generic #101-Ubuntu SMP ..."
        out["kernel-version"] = os_name[1]
    if raw.get("slurmd_version"):
        out["slurmd-version"] = str(raw["slurmd_version"])
    return out


def view(
    raw: dict[str, Any],
    running: int = 0,
    *,
    replace_supported: bool = False,
    pool_label: str = POOL_LABEL,
    isolation_text: str | None = None,
) -> NodeView:
    """One `sinfo --json` node -> NodeView (pure; unit-tested on recorded output). Its
    partition is also its `pool_label` label, where the breaker and the budgets look."""
    flags = _flags(raw)
    reason = str(raw.get("reason") or "")
    # Ours only if it parses as our tag: the agent's standalone drains ("gpuvigil: XID_79
    # gpu:3") and everyone else's are foreign. Slurm may append " : reboot issued".
    ours = parse_tag(reason.split(" : ", maxsplit=1)[0]) is not None
    drained = bool(flags & {"DRAIN", "DRAINED", "DRAINING"})
    down = bool(flags & {"DOWN", "FAIL", "FAILING"})
    # A degraded-node drain (`clusters.slurm_degrade`) is the GPU path's, not the node
    # ladder's (never lifted by it) nor someone else's.
    gpu_drain = reason.startswith(GPU_REASON)
    others = []
    if (drained or down) and not ours and not gpu_drain:
        others.append(f"slurm:{'drain' if drained else 'down'}:{reason or '-'}")
    extra = str(raw.get(wire.SLURM_HEALTH_FIELD.lower()) or "")
    health = wire.decode_health(extra)
    record = decode_record(str(raw.get("comment") or ""))
    if record is None and ours:  # the comment is lost or garbled: the reason still says where
        tag = parse_tag(reason.split(" : ", maxsplit=1)[0])
        if tag:
            since = _epoch(raw.get("reason_changed_at"))
            record = Record(state=tag[0], step=tag[1], code=tag[2], since=since)
    boot = _epoch(raw.get("boot_time"))
    result = None
    if record is not None and record.state is State.REMEDIATING and record.request_id:
        requested = record.since
        timed_out = "reboot timed out" in reason.lower()
        if timed_out or (down and not flags & REBOOT_FLAGS and "REBOOT" in reason.upper()):
            result = AgentResult(record.request_id, False, None, reason)
        elif not flags & REBOOT_FLAGS and boot and requested and boot > requested:
            result = AgentResult(record.request_id, True, boot, "rebooted")
    pool = _pool(raw)
    return NodeView(
        name=str(raw.get("name")),
        pool=pool or DEFAULT_POOL,
        labels={pool_label: pool} if pool else {},
        health=health,
        health_error=None if health else ("unreadable" if extra else "absent"),
        heartbeat_at=health.generated_at if health else None,
        record=record,
        record_error=None,
        blocked_by_us=drained and ours,
        blocked_by_others=tuple(others),
        running=running,
        agent_result=result,
        boot_id=str(int(boot.timestamp())) if boot else "",
        version=version_of(raw),
        preflight_supported=False,
        intent_supported=False,  # Comment holds the record, Extra the health summary
        replace_supported=replace_supported,  # only through a hook: else quarantine at once
        attributes=facts(raw),
        isolation_text=isolation_text,
    )


class SlurmCluster:
    name = "slurm"
    fence: Fence = staticmethod(unfenced)  # the controller sets its leader elector's

    def __init__(
        self, settings: SlurmSettings | None = None, *, pool_label: str = POOL_LABEL
    ) -> None:
        self.settings = settings or SlurmSettings()
        self.pool_label = pool_label  # the controller's `safety.pool_label`
        self.client = SlurmClient(
            bin_dir=self.settings.bin_dir,
            conf=self.settings.conf,
            timeout_s=self.settings.timeout_s,
        )
        self.calls = self.client.calls
        self._lease: FileLease | None = None
        self.isolation = SlurmIsolation(self)
        self.spares = SlurmSpares(self)
        self._pass_jobs: list[dict[str, Any]] | None = None  # every job, as list_nodes read

    def _run(self, tool: str, *args: str) -> str:
        timeout = None
        if tool == "scancel" or (tool == "scontrol" and args and args[0] in WRITES):
            timeout = max(0.1, self.fence())  # a write: fenced first, within the lease left
        try:
            return self.client.run(tool, *args, timeout_s=timeout)
        except SlurmError as e:
            raise (Forbidden if e.kind in ("missing", "refused") else Unavailable)(str(e)) from e

    def _json(self, tool: str, *args: str) -> dict[str, Any]:
        try:
            return self.client.json(tool, *args)
        except SlurmError as e:
            raise (Forbidden if e.kind in ("missing", "refused") else Unavailable)(str(e)) from e

    def _all_jobs(self, node: str | None = None) -> list[dict[str, Any]]:
        argv = ["squeue", "--json"] + (["--nodelist", node] if node else [])
        return [j for j in self._json(*argv).get("jobs") or [] if isinstance(j, dict)]

    def _jobs(self, node: str | None = None, jobs: list[dict[str, Any]] | None = None
              ) -> list[dict[str, Any]]:  # fmt: skip
        """The running jobs (on `node`), from `jobs` when given, else squeue."""
        jobs = self._all_jobs(node) if jobs is None else jobs
        # 22.05's `squeue --json` ignores --nodelist (it lists every job): filter here too
        return [
            j
            for j in jobs
            if str(j.get("job_state", "")).upper() in RUNNING
            and (node is None or node in expand_hostlist(str(j.get("nodes") or "")))
        ]

    def _spare_nodes(self, jobs: list[dict[str, Any]]) -> set[str]:
        """The reservation's nodes less the survivors held for a moving gang job."""
        return set(self.spares.nodes() or ()) - held_nodes(jobs)

    def _raw_nodes(self, name: str | None = None) -> list[dict[str, Any]]:
        argv = ["sinfo", "--json"] + (["--nodes", name] if name else [])
        return list(self._json(*argv).get("nodes") or [])

    def list_nodes(self) -> list[NodeView]:
        running: Counter[str] = Counter()
        jobs = self._pass_jobs = self._all_jobs()
        for job in self._jobs(jobs=jobs):
            running.update(expand_hostlist(str(job.get("nodes") or "")))
        spare = self._spare_nodes(jobs)
        return [self._view(n, running[n.get("name")], spare=n.get("name") in spare)
                for n in self._raw_nodes()]  # fmt: skip

    def make_spare(self, name: str) -> bool:
        return self.spares.make(name)

    def unmake_spare(self, name: str) -> None:
        self.spares.unmake(name)

    def follow_spare_moves(self) -> list[str]:
        """Each controller pass: carry on moving requeued gang jobs onto the spares
        (`SlurmSpares.follow`), from the jobs this pass's `list_nodes` read."""
        jobs = self._pass_jobs if self._pass_jobs is not None else self._all_jobs()
        self._pass_jobs = None  # a second call in the same pass reads afresh
        return self.spares.follow(jobs)

    def get_node(self, name: str) -> NodeView:
        for raw in self._raw_nodes(name):
            if raw.get("name") == name:
                jobs = self._all_jobs()  # all: a held survivor's job is pending
                return self._view(raw, len(self._jobs(name, jobs)),
                                  spare=name in self._spare_nodes(jobs))  # fmt: skip
        raise Forbidden(f"no Slurm node {name}")

    def _view(self, raw: dict[str, Any], running: int, *, spare: bool = False) -> NodeView:
        hook = bool(self.settings.replace_hook)
        iso = self.isolation.text(str(raw.get("name"))) if self.settings.degrade.enabled else None
        v = view(raw, running, replace_supported=hook, pool_label=self.pool_label,
                 isolation_text=iso)  # fmt: skip
        return dataclasses.replace(v, spare=True) if spare else v

    def _update(self, name: str, *fields: str) -> None:
        self._run("scontrol", "update", f"NodeName={name}", *fields)

    def block(self, name: str, *, reason: str) -> None:
        v = self.get_node(name)
        if v.blocked_by_us or v.blocked_by_someone_else:
            return  # already blocked: never overwrite someone else's reason
        self._update(name, "State=DRAIN", f"Reason={reason}")

    def unblock(self, name: str) -> None:
        v = self.get_node(name)
        if v.blocked_by_us and not v.blocked_by_someone_else:
            self._update(name, "State=RESUME")

    def _raw_one(self, name: str) -> dict[str, Any]:
        for raw in self._raw_nodes(name):
            if raw.get("name") == name:
                return raw
        raise Forbidden(f"no Slurm node {name}")

    def store(self, name: str, record: Record, *, version: str = "", block: bool = False) -> None:
        """The record in the Comment, and the drain reason kept to the record's tag (with
        `block`, the drain itself) in the same scontrol call."""
        raw = self._raw_one(name)
        if version and version_of(raw) != version:
            raise Conflict(f"node {name} changed since it was read")
        v = view(raw)
        fields = [f"Comment={record.encode()}"]
        tag = record.tag()
        if (block and not v.blocked_by_us and not v.blocked_by_someone_else) or (
            v.blocked_by_us
            and record.state.blocks
            and (v.record is None or v.record.tag() != tag)
            and not _flags(raw) & REBOOT_FLAGS  # Slurm owns the reason while rebooting
        ):
            fields += ["State=DRAIN", f"Reason={tag}"]
        self._update(name, *fields)

    def drain(self, name: str, *, deadline: datetime, reason: str) -> DrainStatus:
        every = self._all_jobs()  # all: keep_place asks which spares are idle
        jobs = self._jobs(name, every)
        past = datetime.now(UTC) >= deadline
        forced = 0
        if jobs and (past or self.settings.requeue_at_once):
            if self.settings.drain_mode == "wait" and not past:
                return DrainStatus(remaining=len(jobs))
            for job in jobs:
                jid = str(job.get("job_id"))
                if str(job.get("job_state", "")).upper() == "COMPLETING":
                    continue  # already leaving (a requeue's first seconds): Slurm refuses
                if job.get("requeue") and job.get("batch_flag"):
                    self.spares.keep_place(job, name, every)  # a gang job keeps its place
                    self._run("scontrol", "requeue", jid)
                elif past and self.settings.drain_mode == "requeue":
                    self._run("scancel", jid)
                else:
                    continue
                forced += 1
            jobs = self._jobs(name)
        return DrainStatus(remaining=len(jobs), forced=forced)

    def request(self, name: str, *, action: Action, request_id: str, gpus: list[int]) -> None:
        if action not in (Action.RESET_GPU, Action.REBOOT):
            raise Forbidden(f"Slurm cannot {action.value}")
        raw = self._raw_one(name)
        if _flags(raw) & REBOOT_FLAGS:
            return  # already asked (a resend after a restart)
        tag = f"{TAG_PREFIX}{State.REMEDIATING.value}:{action.value}:{request_id}"
        self._run("scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={tag}", name)

    def mark_released(self, name: str, *, at: datetime) -> None:
        """Nothing: the agent on a Slurm node reads no controller-written field. A person
        releasing a node after a repair also writes the time into the agent's
        `<state_dir>/released-at` on the node (docs/agent.md)."""

    def revalidate(self, name: str, *, since: datetime) -> int:
        """Nothing to do: Slurm has no preflight channel to the controller. A VALIDATING
        node ends its validation on a fresh clean health summary published after `since`
        (the agent publishes every interval), and `deploy/slurm/gpuvigil-preflight.sh`
        runs preflight itself as a HealthCheckProgram / Prolog. (The policy does not even
        ask: `NodeView.preflight_supported` is False here.)"""
        return 0

    def replace(self, name: str, *, reason: str) -> None:
        argv = [a.replace("{node}", name) for a in self.settings.replace_hook]
        if not argv:
            raise Forbidden("no replace hook configured (controller.slurm.replace_hook)")
        left = self.fence()
        self.calls["replace_hook"] += 1
        res = execp.run(argv, timeout_s=min(self.settings.hook_timeout_s, left))
        if not res.ok:
            raise Unavailable(f"replace hook: {res.error or res.returncode} {res.stderr_tail()}")

    def isolate_gpu(self, name: str, *, uuid: str, index: int, reason: str) -> Progress:
        """Degrade `name` to run without GPU `index` (`clusters.slurm_degrade`); call again
        until `.done`. Forbidden when `controller.slurm.degrade` is off."""
        return self._degrader().isolate(name, uuid=uuid, index=index, why=reason)

    def restore_gpu(self, name: str, *, uuid: str, index: int) -> Progress:
        """Put GPU `index` of `name` back after its repair; call again until `.done`."""
        return self._degrader().restore(name, uuid=uuid, index=index)

    def gpu_isolation_unavailable(self) -> str | None:
        """None when a GPU can be taken out of a node alone here; else why not (the
        controller then takes the whole-node ladder)."""
        if not self.settings.degrade.enabled:
            return "controller.slurm.degrade.enabled is false"
        if not self.settings.degrade.node_conf:
            return "controller.slurm.degrade.node_conf is not set"
        return self._degrader().enforced()

    # -- per-GPU isolation (clusters.base.GpuIsolating; clusters.slurm_isolation) ----------
    isolation_scope = "slurm"
    gpu_reset_supported = False  # a Slurm reset is a node reboot: isolate until replaced

    def gpu_enforced(self, node: NodeView) -> bool:
        """The degraded-node procedure is on and verified (`degrade.enforcement`)."""
        return self.gpu_isolation_unavailable() is None

    def gpu_holders(self, name: str, gpu_uuid: str) -> list[str] | None:
        return self.isolation.holders(name)

    def evict(self, name: str, pods: list[str], *, deadline: datetime, reason: str) -> DrainStatus:
        return self.isolation.evict(name, pods, deadline=deadline)

    def store_isolation(self, name: str, text: str | None) -> None:
        self.isolation.store(name, text)

    def converge_isolation(self, name: str, text: str | None) -> None:
        if self.settings.degrade.enabled:
            self.isolation.converge(name, text)

    def _degrader(self) -> Degrader:
        if not self.settings.degrade.enabled:
            raise Forbidden("controller.slurm.degrade.enabled is false")
        return Degrader(self)

    def record_event(self, name: str, *, reason: str, message: str, warning: bool = False) -> None:
        """Slurm has no event object: the controller's event log and log lines carry it."""
        self.calls["event"] += 1

    def publish(self, name: str, intent: Intent) -> None:
        raise Forbidden("a Slurm node has no free field for the controller's intent")

    def lease_store(self) -> FileLease:
        """The lease files in `lease_dir`, or `gpuvigil-lease` in the StateSaveLocation
        that `scontrol show config` names (asked on first use)."""
        if self._lease is None:
            self._lease = FileLease(self.settings.lease_dir or self._default_lease_dir)
        return self._lease

    def _default_lease_dir(self) -> str:
        out = self._run("scontrol", "show", "config")
        m = re.search(r"^StateSaveLocation\s*=\s*(\S+)", out, re.MULTILINE)
        if m is None:
            raise Unavailable("scontrol show config names no StateSaveLocation")
        return os.path.join(m.group(1), "gpuvigil-lease")
