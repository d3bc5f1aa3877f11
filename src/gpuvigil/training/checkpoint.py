"""Checkpoints with torch.distributed.checkpoint (DCP): async save, atomic publish, verified load.

Called by `run.Run`. A checkpoint is the folder `step-000000100/` holding DCP's files (model
and optimizer, sharded by DCP so they load at any world size), one `rank-NNNNN.pt` per rank
(RNG states, step, LR scheduler, data position, user extras), and `manifest.json`, written
last by rank 0 after checking that every file DCP's metadata names is complete: the commit.

Async save: the foreground copies the state to host memory (the only stall) and a background
thread writes, verifies and commits, on a gloo side group so its collectives never
interleave with training's. The next save waits for the previous one.
Load: rank 0 verifies the newest committed checkpoint (sizes, SHA-256); a damaged one is
logged and skipped for the previous one; all ranks then load the chosen one.
"""

from __future__ import annotations

import io
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from gpuvigil.training import manifest
from gpuvigil.training.config import CheckpointConfig
from gpuvigil.training.storage import FsspecStorage, Storage, open_storage

log = logging.getLogger("gpuvigil.training.checkpoint")


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def stage(obj: Any, cache: dict[tuple[Any, ...], torch.Tensor], path: tuple[Any, ...] = ()) -> Any:
    """A host-memory copy of a nested state dict: what the background thread writes while
    training goes on changing the originals. Plain tensors are copied into buffers kept
    from the previous save (pinned when the source is on a GPU): after the first save the
    stall is one memcpy, with no allocation and no page faults."""
    if type(obj) is torch.Tensor:
        buf = cache.get(path)
        if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
            buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu", pin_memory=obj.is_cuda)
            cache[path] = buf
        buf.copy_(obj.detach(), non_blocking=obj.is_cuda)
        return buf
    if isinstance(obj, torch.Tensor):  # DTensor and other subclasses: a fresh copy
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: stage(v, cache, (*path, k)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(stage(v, cache, (*path, i)) for i, v in enumerate(obj))
    return obj


def _to_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class Checkpointer:
    def __init__(
        self,
        config: CheckpointConfig,
        *,
        rank: int,
        world_size: int,
        group: Any,
        on_saved: Callable[[int, float, float, str], None] = lambda *a: None,
    ) -> None:
        assert config.dir is not None
        self.config = config
        self.rank, self.world_size, self.group = rank, world_size, group
        self.storage: Storage = open_storage(config.dir)
        self._on_saved = on_saved  # (step, duration_s, stall_s, result)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpuvigil-ckpt")
        self._pending: Future[None] | None = None
        self.fallbacks = 0  # damaged checkpoints skipped by the last load
        self._staging: dict[tuple[Any, ...], torch.Tensor] = {}  # host buffers, reused
        if rank == 0:
            self.storage.makedirs(self.storage.root)

    # --- save -------------------------------------------------------------------------
    def save(self, step: int, tensors: dict[str, Any], rank_state: dict[str, Any]) -> float:
        """Start (async) or do (sync) a save; returns the seconds training was stalled."""
        t0 = time.monotonic()
        self.wait()
        blob = _to_bytes(
            {"rank": self.rank, "world_size": self.world_size, "step": step, **rank_state}
        )
        if self.config.mode == "sync":
            self._write(step, tensors, blob, t0)
            stall = time.monotonic() - t0
        else:
            staged = stage(tensors, self._staging)  # safe: the previous save is done
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the non-blocking copies must land before use
            stall = time.monotonic() - t0
            self._pending = self._pool.submit(self._write, step, staged, blob, t0, stall)
        return stall

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001
                pass  # already logged and recorded by _write

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)

    def _writer(self, folder: str) -> Any:
        if isinstance(self.storage, FsspecStorage):
            from torch.distributed.checkpoint import FsspecWriter

            return FsspecWriter(f"{self.storage.url}/{folder.rsplit('/', 1)[-1]}")
        return dcp.FileSystemWriter(folder, sync_files=True)

    def _reader(self, folder: str) -> Any:
        if isinstance(self.storage, FsspecStorage):
            from torch.distributed.checkpoint import FsspecReader

            return FsspecReader(f"{self.storage.url}/{folder.rsplit('/', 1)[-1]}")
        return dcp.FileSystemReader(folder)

    def _write(
        self, step: int, tensors: dict[str, Any], blob: bytes, t0: float, stall: float | None = None
    ) -> None:
        folder = self.storage.join(manifest.dir_name(step))
        try:
            if self.rank == 0:
                # A folder left by a crashed save of this same step: start clean.
                self.storage.remove_tree(folder)
                self.storage.makedirs(folder)
            dist.barrier(group=self.group)
            self.storage.write_atomic(self.storage.join(folder, rank_file(self.rank)), blob)
            # DCP's finish step gathers every rank's write results before rank 0 writes
            # .metadata, so when save() returns there, every rank file exists too.
            dcp.save(tensors, storage_writer=self._writer(folder), process_group=self.group)
            if self.rank == 0:
                self._commit(step, folder)
        except Exception as e:
            log.error(
                "gpuvigil checkpoint: save of step %d failed: %s; the previous "
                "checkpoint stays the latest",
                step,
                e,
            )
            self._on_saved(step, time.monotonic() - t0, stall or 0.0, "failed")
            raise
        duration = time.monotonic() - t0
        log.info(
            "gpuvigil checkpoint: step %d saved in %.2fs (%s, stall %.3fs)",
            step,
            duration,
            self.config.mode,
            stall if stall is not None else duration,
        )
        self._on_saved(step, duration, stall if stall is not None else duration, "committed")

    def _commit(self, step: int, folder: str) -> None:
        """Rank 0: verify what was written, write the manifest (the commit), prune."""
        problem = self._check_written(folder)
        if problem:
            raise RuntimeError(f"step {step} is incomplete, not committing: {problem}")
        m = manifest.build(
            self.storage,
            folder,
            step=step,
            world_size=self.world_size,
            checksums=self.config.checksums,
            created_ts=time.time(),
        )
        commit_point(self.storage, folder, m)
        for old in manifest.to_prune(self.storage, keep_last=self.config.keep_last):
            self.storage.remove_tree(old)

    def _check_written(self, folder: str) -> str:
        try:
            meta = self._reader(folder).read_metadata()
        except Exception as e:  # noqa: BLE001 (any reader error means: not loadable)
            return f"DCP metadata unreadable: {e}"
        need: dict[str, int] = {}
        for info in (meta.storage_data or {}).values():
            need[info.relative_path] = max(
                need.get(info.relative_path, 0), info.offset + info.length
            )
        need.update({rank_file(r): 1 for r in range(self.world_size)})
        for name, size in sorted(need.items()):
            try:
                got = self.storage.size(self.storage.join(folder, name))
            except (OSError, FileNotFoundError):
                return f"{name} missing"
            if got < size:
                return f"{name} has {got} bytes, needs {size}"
        return ""

    # --- load -------------------------------------------------------------------------
    def choose(self) -> tuple[str | None, list[str]]:
        """Rank 0: the newest intact checkpoint folder and log lines about skipped ones."""
        notes: list[str] = []
        for step, folder in manifest.candidates(self.storage):
            m, why = manifest.verify(self.storage, folder, checksums=self.config.checksums)
            if m is not None:
                return folder, notes
            if why.startswith("no manifest"):
                notes.append(
                    f"gpuvigil checkpoint: {manifest.dir_name(step)} was never "
                    "committed (its save was interrupted); skipping it"
                )
            else:
                notes.append(
                    f"gpuvigil checkpoint: {manifest.dir_name(step)} is DAMAGED "
                    f"({why}); falling back to the previous checkpoint"
                )
        return None, notes

    def load(
        self, make_tensors: Callable[[], dict[str, Any]]
    ) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]] | None:
        """Collective. Loads the newest intact checkpoint into `make_tensors()` (called only
        when there is one: DCP's get_state_dict initialises an empty optimizer with a
        zero-gradient step, which must not happen to a job that starts fresh); returns
        (step, tensors, this rank's saved state or None after a resize, rank 0's state)."""
        box: list[Any] = [None, []]
        if self.rank == 0:
            box = list(self.choose())
        dist.broadcast_object_list(box, src=0, group=self.group)
        folder, notes = box
        self.fallbacks = len([n for n in notes if "DAMAGED" in n])
        if self.rank == 0:
            for note in notes:
                log.warning(note)
        if folder is None:
            return None
        tensors = make_tensors()
        dcp.load(tensors, storage_reader=self._reader(folder), process_group=self.group)
        main = self._read_rank(folder, 0)
        own = None
        if main.get("world_size") == self.world_size:
            own = self._read_rank(folder, self.rank)
        log.info(
            "gpuvigil checkpoint: resumed from %s (step %d, saved by %d ranks, now %d)",
            folder,
            main["step"],
            main.get("world_size"),
            self.world_size,
        )
        return int(main["step"]), tensors, own, main

    def _read_rank(self, folder: str, rank: int) -> dict[str, Any]:
        raw = self.storage.read_bytes(self.storage.join(folder, rank_file(rank)))
        # Our own file, verified by the manifest; it holds numpy RNG state (not weights-only).
        return torch.load(io.BytesIO(raw), weights_only=False)


def commit_point(storage: Storage, folder: str, m: manifest.Manifest) -> None:
    """The single moment a checkpoint becomes loadable (an atomic write of the manifest)."""
    storage.write_atomic(storage.join(folder, manifest.MANIFEST), m.to_json())
