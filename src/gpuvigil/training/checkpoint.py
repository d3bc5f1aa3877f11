"""Checkpoint saves: async or sync, committed by a manifest, agreed on by every rank.

Called by `run.Run` (`resume` loads). A checkpoint is the folder `step-000000100/`:
- `__R_0.distcp`, `.metadata`: model and optimizer tensors through DCP, resharded on load
  (`dcp_storage`: raw bytes and JSON, nothing pickled);
- `rank-0000R.json`: each rank's own state (RNG states, LR scheduler, `run.extra`, and the
  skeleton of its model/optimizer state: the plain values around the tensors);
- `global.json`: the job's state (data position, `run.extra_global`, step, save time);
- `manifest.json`: written last, by rank 0, atomically: the commit. It lists every file with
  the size and SHA-256 its writer computed while writing (`writer`).

A save is one protocol on every rank, whatever fails: clean the folder (rank 0), write
(each rank), gather every rank's digests or error, commit (rank 0, only if every rank
succeeded), broadcast the verdict. So a save that cannot commit is an error on every rank,
and no rank says "saved" for it. Failed saves are counted; `max_consecutive_failures` in a
row end the job with `exit_codes.CHECKPOINT_FAILED`, at the next save (a save point is the
same step on every rank, so every rank exits there together).

Async: the rank stages its tensors into shared host memory (`staging`, the only stall)
and a background thread runs the protocol on a gloo side group, while the rank's writer
process writes and hashes the bytes. The next save first waits for the previous one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from gpuvigil.core import exit_codes
from gpuvigil.training import dcp_storage, manifest, state_codec, tensor_tree
from gpuvigil.training.config import CheckpointConfig
from gpuvigil.training.staging import Stager
from gpuvigil.training.storage import Storage, open_storage
from gpuvigil.training.writer import WriterProcess, write_file

log = logging.getLogger("gpuvigil.training.checkpoint")

GLOBAL = "global.json"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.json"


class CheckpointFailed(SystemExit):
    """Ends the job: too many saves in a row failed (exit_codes.CHECKPOINT_FAILED)."""

    def __init__(self, message: str) -> None:
        super().__init__(exit_codes.CHECKPOINT_FAILED)
        self.message = message


@dataclass(frozen=True)
class Outcome:
    step: int
    committed: bool
    error: str  # "" when committed
    duration_s: float
    stall_s: float
    consecutive_failures: int


def _why(e: BaseException) -> str:
    """One line per failing rank of a DCP CheckpointException, else the exception's line."""
    failures = getattr(e, "failures", None)
    if isinstance(e, CheckpointException) and isinstance(failures, dict):
        parts = []
        for rank, f in sorted(failures.items()):
            exc = f[0] if isinstance(f, tuple) else f
            parts.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        return "; ".join(parts)
    return f"{type(e).__name__}: {e}".splitlines()[0]


def commit_point(storage: Storage, folder: str, m: manifest.Manifest) -> None:
    """The single moment a checkpoint becomes loadable (an atomic write of the manifest)."""
    storage.write_atomic(f"{folder}/{manifest.MANIFEST}", m.to_json())


def _cpu_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(dcp_storage.tensor_bytes(t.detach().cpu().contiguous()).numpy())


class Checkpointer:
    def __init__(
        self,
        config: CheckpointConfig,
        *,
        rank: int,
        world_size: int,
        group: Any,
        on_outcome: Callable[[Outcome], None] = lambda o: None,
    ) -> None:
        assert config.dir is not None
        self.config = config
        self.rank, self.world_size, self.group = rank, world_size, group
        self.storage: Storage = open_storage(config.dir)
        self._on_outcome = on_outcome
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuvigil-ckpt")
        self._pending: Future[Outcome] | None = None
        self.last: Outcome | None = None
        self.consecutive_failures = 0
        self._stager = Stager()
        self._writer: WriterProcess | None = None
        if config.mode == "async":
            self._writer = WriterProcess()  # started now: ready by the first save
        if rank == 0:
            self.storage.makedirs()

    def prepare(self, tensors: Any) -> None:
        """Async only: create the staging arena for these tensors now, before training starts,
        so the first save stalls no longer than the others (`staging.Stager.prepare`)."""
        if self._writer is not None:
            self._stager.prepare(tensor_tree.split(tensors)[0])

    # --- save -------------------------------------------------------------------------
    def save(
        self, step: int, tensors: Any, rank_state: dict[str, Any], global_state: dict[str, Any]
    ) -> float:
        """Start (async) or do (sync) a save; returns the seconds training was stalled.
        Raises CheckpointFailed when the failures in a row reach the configured limit."""
        t0 = time.monotonic()
        self.wait()
        self.check_escalation()
        flat, skeleton = tensor_tree.split(tensors)
        rank_blob = state_codec.dumps(
            {
                "rank": self.rank,
                "world_size": self.world_size,
                "step": step,
                "skeleton": skeleton,
                **rank_state,
            }
        )
        global_blob = (
            state_codec.dumps({"step": step, "world_size": self.world_size, **global_state})
            if self.rank == 0
            else None
        )
        if self._writer is None:  # sync
            out = self._write(step, flat, rank_blob, global_blob, t0=t0, stall=None)
            return out.duration_s
        staged = self._stager.stage(flat)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking copies must land before the write
        stall = time.monotonic() - t0
        self._pending = self._pool.submit(
            self._write, step, staged, rank_blob, global_blob, t0=t0, stall=stall
        )
        return stall

    def wait(self) -> Outcome | None:
        """Block until the save in flight (if any) is committed or has failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # _write reports its own failures; it raises only on bugs
        return self.last

    def check_escalation(self) -> None:
        limit = self.config.max_consecutive_failures
        if limit and self.consecutive_failures >= limit:
            assert self.last is not None
            message = (
                f"gpuvigil checkpoint: {self.consecutive_failures} saves in a row failed (the "
                f"last, of step {self.last.step}: {self.last.error}); ending the job with exit "
                f"code {exit_codes.CHECKPOINT_FAILED} (checkpoint.max_consecutive_failures="
                f"{limit})"
            )
            log.error(message)
            raise CheckpointFailed(message)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            if self._writer is not None:
                self._writer.close()
            self._stager.close()

    def _sink(self, rel: str, tensors: list[torch.Tensor]) -> dict[str, Any]:
        if self._writer is None:
            return write_file(self.storage, rel, [_cpu_bytes(t) for t in tensors])
        arena = self._stager.arena
        assert arena is not None
        spans = []
        for t in tensors:
            span = arena.span(t)
            if span is None:
                raise RuntimeError("a tensor to save is not in the staging arena")
            spans.append(span)
        self._writer.use_arena(arena.fd, arena.size)
        return self._writer.write(self.storage.location, rel, spans)

    def _gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _write(
        self,
        step: int,
        flat: dict[str, torch.Tensor],
        rank_blob: bytes,
        global_blob: bytes | None,
        *,
        t0: float,
        stall: float | None,
    ) -> Outcome:
        folder = manifest.dir_name(step)
        err, digests = "", {}
        if self.rank == 0:
            try:  # a folder left by a crashed save of this same step: start clean
                self.storage.remove_tree(folder)
                self.storage.makedirs(folder)
            except Exception as e:  # noqa: BLE001 (every failure becomes the save's verdict)
                err = f"cannot create {folder}: {e}"
        try:  # also a barrier: nobody writes before rank 0 cleaned the folder
            err = next((e for e in self._gather(err) if e), "")
        except (RuntimeError, ValueError) as e:
            err = f"lost contact with the other ranks before the save: {e}".splitlines()[0]
        if not err:
            try:
                digests[rank_file(self.rank)] = write_file(
                    self.storage, f"{folder}/{rank_file(self.rank)}", [memoryview(rank_blob)]
                )
                if global_blob is not None:
                    digests[GLOBAL] = write_file(
                        self.storage, f"{folder}/{GLOBAL}", [memoryview(global_blob)]
                    )
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
            writer = dcp_storage.Writer(self.storage, folder, sink=self._sink)
            try:  # collective even after a local error: DCP raises on every rank if any failed
                dcp.save(flat, storage_writer=writer, process_group=self.group)
                digests.update(writer.digests)
            except (Exception, CheckpointException) as e:  # noqa: BLE001 (a BaseException)
                err = err or _why(e)
            err = self._agree(step, folder, err, digests)
        self.consecutive_failures = self.consecutive_failures + 1 if err else 0
        duration = time.monotonic() - t0
        out = Outcome(
            step,
            not err,
            err,
            duration,
            stall if stall is not None else duration,
            self.consecutive_failures,
        )
        self.last = out
        if err:
            log.error(
                "gpuvigil checkpoint: save of step %d FAILED on every rank: %s; the previous "
                "checkpoint stays the latest (%d failed in a row)",
                step,
                err,
                self.consecutive_failures,
            )
        else:
            log.info(
                "gpuvigil checkpoint: step %d saved in %.2fs (%s, stall %.3fs)",
                step,
                duration,
                self.config.mode,
                out.stall_s,
            )
        self._on_outcome(out)
        return out

    def _agree(self, step: int, folder: str, err: str, digests: dict[str, Any]) -> str:
        """Gather every rank's result, commit on rank 0, share the verdict. A rank that
        loses contact with the others (a peer died mid-save) reports that as its error;
        rank 0's verdict stands on rank 0 even when it cannot tell the others."""
        try:
            results = self._gather((err, digests))
        except (RuntimeError, ValueError) as e:
            return f"lost contact with the other ranks during the save: {e}".splitlines()[0]
        verdict = self._commit(step, folder, results) if self.rank == 0 else ""
        box = [verdict]
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except (RuntimeError, ValueError) as e:
            if self.rank != 0:
                return f"lost contact with rank 0 before its verdict: {e}".splitlines()[0]
        return verdict if self.rank == 0 else str(box[0])

    def _commit(self, step: int, folder: str, results: list[tuple[str, dict[str, Any]]]) -> str:
        """Rank 0: check the writers' reports, write the manifest (the commit), prune."""
        named = (
            e if e.startswith("rank ") else f"rank {r}: {e}"
            for r, (e, _) in enumerate(results)
            if e
        )
        problems = list(dict.fromkeys(named))  # DCP's own error already names every rank
        if problems:
            return "; ".join(problems[:3])
        files: dict[str, dict[str, Any]] = {}
        for _, d in results:
            files.update(d)
        try:
            missing = self._incomplete(folder, files)
            if missing:
                return f"step {step} is incomplete, not committing: {missing}"
            m = manifest.build(
                step=step, world_size=self.world_size, files=files, created_ts=time.time()
            )
            commit_point(self.storage, folder, m)
            for old in manifest.to_prune(self.storage, keep_last=self.config.keep_last):
                self.storage.remove_tree(old)
        except Exception as e:  # noqa: BLE001
            return f"commit failed: {type(e).__name__}: {e}"
        return ""

    def _incomplete(self, folder: str, files: dict[str, dict[str, Any]]) -> str:
        """Every piece DCP's metadata names lies within a file a writer reported."""
        md = dcp_storage.metadata_from_json(
            self.storage.read_bytes(f"{folder}/{dcp_storage.METADATA}")
        )
        need: dict[str, int] = {rank_file(r): 1 for r in range(self.world_size)}
        need[GLOBAL] = 1
        for piece in (md.storage_data or {}).values():
            need[piece.file] = max(need.get(piece.file, 0), piece.offset + piece.length)
        for name, size in sorted(need.items()):
            if name not in files:
                return f"{name} missing"
            if files[name]["size"] < size:
                return f"{name} has {files[name]['size']} bytes, needs {size}"
        return ""
