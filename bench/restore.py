"""Restore against a plain `dcp.load`: issue #24 item 8 (target: within 1.3x).

    PYTHONPATH=src python bench/restore.py [sizes in MB, default 10 200 1024]

One process (a 1-rank gloo group), CPU. For each size, the same state (8 float32 tensors)
is saved twice: by gpuvigil's `Checkpointer` (sync) and by `dcp.save` with DCP's own
`FileSystemWriter`. Then, page cache warm for both (each is loaded once before timing),
median of 3 alternated runs:

- baseline: `dcp.load(state, storage_reader=FileSystemReader(dir))`;
- gpuvigil: what a resume does, `resume.choose` (the manifest, every file's size and
  SHA-256, the parse check of the JSON files) then `resume.load`.

Prints each time, the ratio gpuvigil / dcp.load, and the verification's share.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from gpuvigil.training import checkpoint, resume
from gpuvigil.training.config import CheckpointConfig
from gpuvigil.training.storage import Storage, cores


def state_of(nbytes: int) -> dict[str, torch.Tensor]:
    n = max(1, nbytes // 4 // 8)
    return {f"layer{i}.w": torch.randn(n) for i in range(8)}


def zeros_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def plain(state: dict[str, torch.Tensor], folder: Path) -> float:
    live = zeros_like(state)
    t0 = time.perf_counter()
    dcp.load(live, storage_reader=dcp.FileSystemReader(str(folder)))
    took = time.perf_counter() - t0
    assert all(torch.equal(live[k], state[k]) for k in state)
    return took


def ours(state: dict[str, torch.Tensor], storage: Storage, group: Any) -> tuple[float, float]:
    """(seconds of the whole resume, seconds of its verification)."""
    live = {"model": zeros_like(state)}
    t0 = time.perf_counter()
    choice = resume.choose(storage, rank=0, world_size=1, group=group, checksums=True)
    t1 = time.perf_counter()
    assert choice.folder is not None, choice.skipped
    resume.load(storage, choice.folder, live, rank=0, world_size=1, group=group)
    took = time.perf_counter() - t0
    assert all(torch.equal(live["model"][k], state[k]) for k in state)
    return took, t1 - t0


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [10, 200, 1024]
    tmp = Path(tempfile.mkdtemp(prefix="gpuvigil-restore-"))
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    group = dist.group.WORLD
    print(f"cores {cores()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'state':>8} {'dcp.load':>9} {'gpuvigil':>9} {'verify':>8} {'load':>8} {'ratio':>6}")
    try:
        for mb in sizes:
            state = state_of(mb << 20)
            mine, theirs = tmp / f"ours-{mb}", tmp / f"dcp-{mb}"
            ck = checkpoint.Checkpointer(
                CheckpointConfig(dir=str(mine), mode="sync"), rank=0, world_size=1, group=group
            )
            ck.save(1, {"model": state}, {}, {})
            ck.close()
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(theirs)))
            plain(state, theirs), ours(state, ck.storage, group)  # warm the page cache
            base, whole, ver = [], [], []
            for _ in range(3):
                base.append(plain(state, theirs))
                t, v = ours(state, ck.storage, group)
                whole.append(t)
                ver.append(v)
            b, o, v = (statistics.median(x) for x in (base, whole, ver))
            print(f"{mb:>6}MB {b:>8.3f}s {o:>8.3f}s {v:>7.3f}s {o - v:>7.3f}s {o / b:>6.2f}")
            shutil.rmtree(mine)
            shutil.rmtree(theirs)
            del state
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
