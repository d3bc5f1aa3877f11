"""What a rank writes about the job: events (core.events) and exit records (`lifecycle`).

Owned by `run.Run`. Events go to `events_file` (one writer per process, whole lines);
job-level events come from rank 0 only, hang events from the rank that hung. Exit records
go beside the checkpoints when there is a checkpoint folder.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from gpuvigil.core import exit_codes
from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.training import lifecycle
from gpuvigil.training.checkpoint import Outcome
from gpuvigil.training.process_group import Env
from gpuvigil.training.storage import Storage
from gpuvigil.training.watchdog import HangRecord

log = logging.getLogger("gpuvigil.training")


def classify(exc: BaseException) -> tuple[str, int]:
    """(kind, exit code) of an exception that ends a rank (`lifecycle.KINDS`)."""
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 1
        return lifecycle.kind_of_exit(code), code
    text = f"{type(exc).__name__}: {exc}"
    waiting = isinstance(exc, getattr(dist, "DistError", ())) or any(
        w in text for w in ("Connection closed by peer", "Connection reset", "Gloo", "NCCL")
    )
    return ("victim" if waiting else "user_code"), 1


class Journal:
    def __init__(self, env: Env) -> None:
        self.env = env
        self.storage: Storage | None = None
        self._writer: EventWriter | None = None
        self._started_ts = time.time()
        self._exited = False

    def open(self, path: Path | None) -> None:
        if path is not None:
            self._writer = EventWriter(Path(path))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def event(
        self, kind: Kind, data: dict[str, Any], *, node: str | None = None, here: bool = True
    ) -> None:
        """`node`: the node the event is about; else this rank's own (`here`), or none."""
        if self._writer is None:
            return
        self._writer.write(
            Event(
                ts=time.time(),
                kind=kind,
                source="training",
                node=node or (self.env.node if here else None),
                job=self.env.job,
                data={k: v for k, v in data.items() if v is not None},
            )
        )

    def checkpoint(self, out: Outcome) -> None:
        """Rank 0: one `checkpoint` event per save, committed or failed."""
        if self.env.rank != 0:
            return
        data: dict[str, Any] = {
            "step": out.step,
            "duration_s": round(out.duration_s, 4),
            "stall_s": round(out.stall_s, 4),
            "result": "ok" if out.committed else "failed",
        }
        if not out.committed:
            data.update(error=out.error[:500], consecutive_failures=out.consecutive_failures)
        self.event(Kind.CHECKPOINT, data)

    # --- the job's lifecycle (rank 0) -----------------------------------------------------
    def started(
        self,
        *,
        nodes: list[str],
        resumed_step: int,
        saved_ts: float | None,
        tier: str | None = None,
        tier_note: str | None = None,
    ) -> None:
        """After the restore: job.start for a new job, job.restart for any later attempt."""
        if self.env.rank != 0:
            return
        records: list[lifecycle.ExitRecord] = []
        names: list[str] = []
        if self.storage is not None:
            records, names = lifecycle.read_exits(self.storage)
        if self.env.restart_count == 0 and resumed_step == 0 and not records:
            self.event(
                Kind.JOB_START,
                {
                    "nodes": sorted(set(nodes)),
                    "gpus": self.env.world_size,
                    "ranks": self.env.world_size,
                },
            )
        else:
            data = lifecycle.restart_data(
                records,
                attempt=self.env.restart_count,
                resumed_step=resumed_step,
                saved_ts=saved_ts,
                now=time.time(),
            )
            data.update(tier=tier, tier_note=tier_note)  # memory | persistent (memtier)
            log.warning("gpuvigil: this attempt follows one that ended: %s", data["reason"])
            # The culprit's node; none when no record names one (rank 0's own node is
            # the failed node's healthy peer as often as not).
            self.event(Kind.JOB_RESTART, data, node=data.get("node"), here=False)
        for name in names:
            try:
                assert self.storage is not None
                self.storage.remove(name)
            except OSError as e:
                log.warning("could not remove exit record %s: %s", name, e)

    def ready(
        self,
        *,
        attempt: int,
        step: int,
        first_step_s: float,
        init_ts: float | None,
        group_ts: float | None,
        restored_ts: float | None,
    ) -> None:
        """Rank 0, after the first step of an attempt: when each phase of its start ended,
        so a restart's process start, rendezvous, restore and first step can be measured
        (the lab's restart_phases) rather than assumed. Also a lost rank's replacement in an
        in-process restart (a fresh process joining a later generation): where rank 0
        survived, its start is the only new process start the restart has."""
        env = self.env
        replacement = env.config.restart.in_process and env.restart_count > 0 and not env.survivor
        if env.rank != 0 and not replacement:
            return
        data = {
            "rank": env.rank,
            "attempt": attempt,
            "step": step,
            "first_step_s": round(first_step_s, 4),
            "init_ts": init_ts,
            "group_ts": group_ts,
            "restored_ts": restored_ts,
        }
        self.event(Kind.STARTUP, data)

    def end(self, *, steps: int) -> None:
        if self.env.rank == 0:
            self.event(
                Kind.JOB_END,
                {"result": "succeeded", "exit_code": exit_codes.SUCCESS, "steps": steps},
            )

    # --- how this rank ends ---------------------------------------------------------------
    def exit(self, *, kind: str, code: int, step: int, detail: str) -> None:
        if self._exited:
            return
        self._exited = True
        lifecycle.write_exit(
            self.storage,
            lifecycle.ExitRecord(
                time.time(), kind, self.env.rank, self.env.node, code, step, detail
            ),
        )

    def hung(self, record: HangRecord) -> None:
        """The hang watchdog fired on this rank: its event and its exit record."""
        self.event(Kind.HANG, record.data())
        v = record.verdict
        culprits = v.culprits if v is not None else record.behind
        if record.culprit and (v is None or v.why == "behind"):
            kind = "behind"  # the rank its peers wait for, wherever its own stack is
        elif record.culprit:
            kind = "hang"  # outside any collective while its peers wait in one
        elif record.in_collective or record.reason == "peer" or culprits:
            kind = "victim"
        else:
            kind = "hang"
        waited = f"; waited for rank {', '.join(map(str, culprits))}" if culprits else ""
        self.exit(
            kind=kind,
            code=exit_codes.HANG,
            step=record.step,
            detail=f"watchdog ({record.reason}) at {record.where}{waited}"
            + (f"; {v.text}" if v is not None and not culprits else ""),
        )

    def exit_of(self, exc: BaseException, *, step: int) -> None:
        kind, code = classify(exc)
        self.exit(kind=kind, code=code, step=step, detail=f"{type(exc).__name__}: {exc}"[:300])
