"""The Slurm adapter's side of per-GPU isolation (`clusters.base.GpuIsolating`): where the
record lives, who holds the GPUs, and the degraded node that enforces it.

Called by the controller's GPU path (`platform.gpu_path`) through `SlurmCluster`. Slurm
cannot keep work off one GPU of a node in service, so the record is enforced by the
degraded-node procedure (`clusters.slurm_degrade`): while a record stands the node is
drained, rewritten to 7 GPUs and resumed; once it is deleted (the GPU repaired, replaced
or cleared) the node is restored to 8 (`converge`, every pass, level-based).

- record: `<folder>/<node>.json` (`isolation.Isolation` as JSON), in `gpuvigil-isolation`
  beside the lease folder (a folder every controller host shares: the StateSaveLocation
  by default), written atomically;
- holders: every running job on the node that holds a GPU (a gres.conf change aborts jobs
  using any GPU of the node, not only the bad one), or None when that cannot be read;
- no per-GPU reset: Slurm's reset is a node reboot, so the GPU is isolated until replaced.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpuvigil.core import files
from gpuvigil.io import slurm_conf as sc
from gpuvigil.platform.clusters.base import ClusterError, DrainStatus, Unavailable
from gpuvigil.platform.clusters.slurm_degrade import Degrader, holds_gpu
from gpuvigil.platform.isolation import decode_isolation

if TYPE_CHECKING:
    from gpuvigil.platform.clusters.slurm import SlurmCluster

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a Slurm node name as a file name


class SlurmIsolation:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.c = cluster
        self._gres: tuple[tuple[int, int], str] | None = None  # (mtime, size) -> text

    def _gres_text(self, d: Degrader) -> str:
        """gres.conf, read again only when it changed (`converge` asks for every node
        on every pass)."""
        try:
            st = d.gres_conf.stat()
        except OSError as e:
            raise Unavailable(f"{d.gres_conf}: {e.strerror or e}") from e
        key = (st.st_mtime_ns, st.st_size)
        if self._gres is None or self._gres[0] != key:
            self._gres = (key, d.read_gres())
        return self._gres[1]

    def folder(self) -> Path:
        return Path(self.c.lease_store().dir).parent / "gpuvigil-isolation"

    def _path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise Unavailable(f"node name {name!r} cannot name a record file")
        return self.folder() / f"{name}.json"

    def text(self, name: str) -> str | None:
        """The stored record; None when there is none. An unreadable folder raises
        Unavailable (never "no record": that would restore a degraded node)."""
        try:
            return self._path(name).read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise Unavailable(f"isolation record of {name}: {e.strerror or e}") from e

    def store(self, name: str, text: str | None) -> None:
        self.c.fence()
        path = self._path(name)
        try:
            if text is None:
                path.unlink(missing_ok=True)
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            files.write_atomic(path, text.encode())
        except OSError as e:
            raise Unavailable(f"cannot write {path}: {e.strerror or e}") from e

    def holders(self, name: str) -> list[str] | None:
        """Job ids holding GPUs on `name`; None when slurmctld's answer cannot say."""
        try:
            jobs = [str(j.get("job_id")) for j in self.c._jobs(name) if holds_gpu(j)]
            used = Degrader(self.c).gpus_in_use(name)
        except ClusterError:
            return None
        if used and not jobs:
            return None  # GPUs in use and no job to name: unknown, never "nobody"
        return jobs

    def evict(self, name: str, jobs: list[str], *, deadline: datetime) -> DrainStatus:
        """Past `deadline`, requeue the holders that allow it and cancel the rest (the
        node is drained already by `converge`); before it, wait."""
        running = {str(j.get("job_id")): j for j in self.c._jobs(name) if holds_gpu(j)}
        left = [running[j] for j in jobs if j in running]
        forced = 0
        if left and datetime.now(UTC) >= deadline:
            for job in left:
                jid = str(job.get("job_id"))
                if job.get("requeue") and job.get("batch_flag"):
                    self.c._run("scontrol", "requeue", jid)
                else:
                    self.c._run("scancel", jid)
                forced += 1
            left = [j for j in self.c._jobs(name) if holds_gpu(j) and str(j.get("job_id")) in jobs]
        return DrainStatus(remaining=len(left), forced=forced)

    def converge(self, name: str, text: str | None) -> None:
        """Make the node match its record: degraded while one stands, restored after."""
        rec = decode_isolation(text)
        if text is not None and rec is None:
            return  # a garbled record: touch nothing (the GPU path hands the node back)
        d = Degrader(self.c)
        if rec is not None:
            if rec.scope == "slurm":
                d.isolate(name, uuid=rec.gpu_uuid, index=rec.index, why=rec.code or "isolated")
            return
        for m in sc.markers(self._gres_text(d), name):
            d.restore(name, uuid=m.uuid, index=m.index)
