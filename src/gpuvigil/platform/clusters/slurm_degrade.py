"""A degraded Slurm node: one bad GPU out of service, the other seven back at work.

Called by the Slurm adapter (`SlurmCluster.isolate` / `restore`) for the controller, one
call per pass until `Progress.done`. Every step reads the level first, so a controller that
restarts mid-way redoes only what is not done yet:

1. drain with the reason `gpuvigil gpu <uuid> idx <N>: <why>` (never over someone else's);
2. wait until no job holds a GPU there (`scontrol show node -d`'s GresUsed and squeue's
   per-job GRES, both; unreadable output counts as busy);
3. rewrite the node's gres.conf lines without `/dev/nvidia<N>` and its `Gres=gpu:N` in the
   slurm.conf fragment (`degrade.node_conf`), atomically, through `io.slurm_conf`;
4. `scontrol reconfigure` (slurmd re-reads gres.conf), then, because slurmctld 22.05
   refuses a File-bound count change on reconfigure ("Attempt to change gres/gpu Count on
   node X from 8 to 7 invalid with File configuration"), the `restart_slurmctld` command,
   and wait until slurmctld shows the new count with no INVALID_REG flag;
5. resume. `restore` does the same in reverse after the repair.

Any failure in 3-4 leaves the node drained, its reason `... : degrade failed: <why>`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuvigil.core import files
from gpuvigil.io import exec as execp
from gpuvigil.io import slurm_conf as sc
from gpuvigil.io.slurm_client import parse_show_node
from gpuvigil.platform.clusters.base import Forbidden, Unavailable
from gpuvigil.platform.state import parse_tag

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.slurm import SlurmCluster

PREFIX = "gpuvigil gpu "  # every degrade reason starts so
DRAINED = {"DRAIN", "DRAINED", "DRAINING"}


@dataclass(frozen=True)
class Progress:
    """Where the procedure stands: `step` is draining | reconfiguring | done; `gpu_jobs`
    the jobs still holding GPUs on the node; `gpus` slurmctld's count now."""

    step: str
    gpu_jobs: int = 0
    gpus: int | None = None

    @property
    def done(self) -> bool:
        return self.step == "done"


def reason(uuid: str, index: int, why: str) -> str:
    return f"{PREFIX}{uuid} idx {index}: {why}"


def _ours(text: str) -> bool:
    return text.startswith(PREFIX) or parse_tag(text.split(" : ", 1)[0]) is not None


def holds_gpu(job: dict[str, Any]) -> bool:
    """A running job that holds (or may hold) a GPU: any GRES detail or GPU request."""
    keys = ("gres_detail", "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")
    return any("gpu" in str(job.get(k) or "") for k in keys)


def _settled(shown: dict[str, str], target: int | None) -> bool:
    """slurmctld counts `target` GPUs on the node and its slurmd registered them: no
    INVALID_REG (counts disagree) and no NOT_RESPONDING (a restarted slurmctld has not
    heard from it yet, so the count is only the configuration's; measured: UNKNOWN and
    BootTime=None until the slurmd registers)."""
    state = shown.get("State", "").upper()
    fresh = not any(f in state for f in ("INVALID_REG", "NOT_RESPONDING", "*", "UNKNOWN"))
    fresh = fresh and shown.get("BootTime", "None") not in ("None", "")
    return target is not None and sc.gres_count(shown.get("Gres", "")) == target and fresh


class Degrader:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.c = cluster
        self.s = cluster.settings.degrade
        conf_dir = Path(cluster.settings.conf or "/etc/slurm/slurm.conf").parent
        self.gres_conf = Path(self.s.gres_conf or conf_dir / "gres.conf")
        self.node_conf = Path(self.s.node_conf) if self.s.node_conf else None

    # -- reading ------------------------------------------------------------------------
    def _show(self, name: str) -> dict[str, str]:
        f = parse_show_node(self.c._run("scontrol", "show", "node", name, "-d", "-o"))
        if f.get("NodeName") != name or "State" not in f:
            raise Unavailable(f"scontrol show node {name}: output does not parse")
        return f

    def gpus_in_use(self, name: str, shown: dict[str, str] | None = None) -> int:
        """slurmctld's GresUsed count for `name`; unreadable -> Unavailable."""
        used = (shown or self._show(name)).get("GresUsed")
        n = sc.gres_count(used or "")
        if n is None:
            raise Unavailable(f"{name}: GresUsed={used!r} does not say which GPUs are in use")
        return n

    def gpu_jobs(self, name: str, shown: dict[str, str]) -> int:
        """Jobs holding GPUs on `name`, from two sources; unreadable -> Unavailable."""
        n = self.gpus_in_use(name, shown)
        jobs = sum(1 for j in self.c._jobs(name) if holds_gpu(j))
        return max(jobs, 1 if n else 0)  # GPUs in use with no job listed: still busy

    def read_gres(self) -> str:
        try:
            return self.gres_conf.read_text()
        except OSError as e:
            raise Unavailable(f"{self.gres_conf}: {e.strerror or e}") from e

    def enforced(self) -> str | None:
        """None when slurmd keeps jobs off a GPU that gres.conf no longer lists, as
        `degrade.enforcement` says and `scontrol show config` confirms; else why not."""
        out = self.c._run("scontrol", "show", "config")
        conf = {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in out.splitlines())}
        if self.s.enforcement == "taskprolog":
            if "gpuvigil" not in conf.get("TaskProlog", ""):
                return f"TaskProlog is {conf.get('TaskProlog')!r}, not gpuvigil-taskprolog"
            return None
        if "task/cgroup" not in conf.get("TaskPlugin", ""):
            return f"TaskPlugin is {conf.get('TaskPlugin')!r}, not task/cgroup"
        if conf.get("ConstrainDevices", "").lower() != "yes":
            return "cgroup.conf does not set ConstrainDevices=yes"
        return None

    # -- the procedure --------------------------------------------------------------------
    def isolate(self, name: str, *, uuid: str, index: int, why: str) -> Progress:
        """Take GPU `index` (`uuid`) of `name` out; call again until done."""
        return self._step(name, uuid=uuid, index=index, why=why, restore=False)

    def restore(self, name: str, *, uuid: str, index: int) -> Progress:
        """Put GPU `index` back after its repair; call again until done."""
        return self._step(name, uuid=uuid, index=index, why="restoring", restore=True)

    def _texts(
        self, name: str, *, uuid: str, index: int, restore: bool
    ) -> list[tuple[Path, str, str]]:
        if self.node_conf is None:
            raise Forbidden("controller.slurm.degrade.node_conf is not set")
        out = []
        for path, change in ((self.gres_conf, sc.degrade_gres), (self.node_conf, sc.degrade_count)):
            try:
                old = path.read_text()
            except OSError as e:
                raise Unavailable(f"{path}: {e.strerror or e}") from e
            try:
                new = (
                    sc.restore(old, name, uuid=uuid)
                    if restore
                    else change(old, name, uuid=uuid, index=index)
                )
            except sc.ConfError as e:
                raise Forbidden(f"{path}: {e}") from e
            out.append((path, old, new))
        return out

    def _step(self, name: str, *, uuid: str, index: int, why: str, restore: bool) -> Progress:
        shown = self._show(name)
        flags = set(shown["State"].upper().replace("*", "").split("+"))
        current = shown.get("Reason", "")
        if flags & (DRAINED | {"DOWN", "FAIL"}) and current and not _ours(current):
            raise Forbidden(f"{name} is drained by someone else: {current}")
        texts = self._texts(name, uuid=uuid, index=index, restore=restore)
        target = sc.node_count(texts[1][2], name)
        count = sc.gres_count(shown.get("Gres", ""))
        settled = all(old == new for _, old, new in texts) and _settled(shown, target)
        mine = reason(uuid, index, why)
        if settled and not flags & DRAINED:
            return Progress("done", gpus=count)
        if not current.startswith(reason(uuid, index, "")) or not flags & DRAINED:
            self.c._update(name, "State=DRAIN", f"Reason={mine}")
        if not settled:
            busy = self.gpu_jobs(name, shown)
            if busy:
                return Progress("draining", gpu_jobs=busy, gpus=count)
            try:
                count = self._apply(name, texts, target)
            except (Forbidden, Unavailable) as e:
                failed = reason(uuid, index, f"{'restore' if restore else 'degrade'} failed: {e}")
                self.c._update(name, "State=DRAIN", f"Reason={failed[:200]}")
                raise
            if count != target:
                return Progress("reconfiguring", gpus=count)
        self.c._update(name, "State=RESUME")
        return Progress("done", gpus=count)

    def _apply(
        self, name: str, texts: list[tuple[Path, str, str]], target: int | None
    ) -> int | None:
        self.c.fence()  # a replica that may no longer act rewrites nothing
        for path, old, new in texts:
            if old != new:
                try:
                    files.write_atomic(path, new.encode(), mode=path.stat().st_mode & 0o7777)
                except OSError as e:
                    raise Unavailable(f"cannot write {path}: {e.strerror or e}") from e
        # slurmd re-reads gres.conf on reconfigure; slurmctld keeps a File-bound count
        # until it restarts (measured, 22.05.8). Reconfigure first, so that the restarted
        # slurmctld meets a slurmd that already counts the new files.
        self.c._run("scontrol", "reconfigure")
        shown = self._wait(name, target, limit_s=3.0)
        if _settled(shown, target):
            return target
        argv = list(self.s.restart_slurmctld)
        if not argv:
            raise Forbidden("slurmctld must restart for the new GPU count; restart_slurmctld is []")
        self.c.calls["restart_slurmctld"] += 1
        res = execp.run(argv, timeout_s=min(self.s.restart_timeout_s, self.c.fence()))
        if not res.ok:
            raise Unavailable(
                f"restart_slurmctld: {res.error or res.returncode} {res.stderr_tail(200)}"
            )
        shown = self._wait(name, target, limit_s=self.s.register_timeout_s)
        return target if _settled(shown, target) else None

    def _wait(self, name: str, target: int | None, *, limit_s: float) -> dict[str, str]:
        """slurmctld's view of `name` once it shows `target` GPUs and a valid registration,
        or the last one read at `limit_s` (slurmctld restarting: not answering counts)."""
        end = time.monotonic() + limit_s
        shown: dict[str, str] = {"State": "UNKNOWN"}
        while True:
            try:
                shown = self._show(name)
            except Unavailable:
                pass
            if _settled(shown, target) or time.monotonic() >= end:
                return shown
            time.sleep(0.5)
