"""What one in-memory tier copy costs the training thread, against a plain synchronous DCP
save of the same state: 2 ranks on gloo (CPU), one process each, on this machine.

    PYTHONPATH=src python bench/memtier.py

For 10 MB and 200 MB of state a rank, the median of 3 of each, alternated:
- stall: `MemTier.save` returning, the training thread's part (the snapshot into the
  reused host buffer; the previous copy is done);
- total: until `MemTier.wait` returns, the copy done on the tier's thread (hash, write to
  the holder folder, exchange with the peer, write its copy);
- back to back: the stall of a save that comes while the previous copy is still in flight
  (it waits for that copy first), once;
- `dcp.save` to a temp folder.
Prints seconds, stall bytes per second a rank, and the ratios to DCP. The simulator
charges `SimConfig.memtier_copy_bytes_per_s` (the stall's rate) per copy (docs/simulator.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from gpuvigil.io.ports import free_port
from gpuvigil.training.config import MemTierConfig
from gpuvigil.training.memtier import MemTier

SIZES = (("10 MB", 10 << 20), ("200 MB", 200 << 20))
REPEATS = 3


def _rank(rank: int, port: int, root: str, shm: str, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    lines = []
    for label, nbytes in SIZES:
        state = {"w": torch.full((nbytes // 4,), float(rank), dtype=torch.float32)}
        cfg = MemTierConfig(enabled=True, dir=str(Path(shm) / "{rank}"))
        tier = MemTier(cfg, rank=rank, world_size=2, group=None, job="bench", node=str(rank))
        stall, total, plain = [], [], []
        for i in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            tier.save(i, state, {"rank": rank})
            stall.append(time.perf_counter() - t0)
            tier.wait()
            total.append(time.perf_counter() - t0)
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save({"w": state["w"]}, checkpoint_id=str(Path(root) / f"dcp-{label}-{i}"))
            plain.append(time.perf_counter() - t0)
        dist.barrier()
        tier.save(REPEATS, state, {"rank": rank})
        t0 = time.perf_counter()
        tier.save(REPEATS + 1, state, {"rank": rank})  # the previous copy is still in flight
        back = time.perf_counter() - t0
        tier.close()
        s, t, p = (statistics.median(x) for x in (stall, total, plain))
        lines.append(
            f"{label:>8} {s:>8.3f}s {t:>8.3f}s {back:>8.3f}s {p:>9.3f}s "
            f"{nbytes / s / 1e6:>9.0f} {s / p:>7.2f} {t / p:>7.2f}"
        )
    if rank == 0:
        out.write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


def main() -> None:
    # the holder folders on tmpfs, as memtier.dir's default; DCP's on the disk it would use
    tmpfs = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory() as root, tempfile.TemporaryDirectory(dir=tmpfs) as shm:
        out = Path(root) / "result.txt"
        args = (free_port(), root, shm, out)
        mp.start_processes(_rank, args=args, nprocs=2, start_method="spawn")
        print(f"torch {torch.__version__}, {os.cpu_count()} cores, {sys.platform}")
        print(
            f"{'state':>8} {'stall':>9} {'total':>9} {'b2b stall':>9} {'dcp.save':>10} "
            f"{'stall MB/s':>9} {'st/dcp':>7} {'tot/dcp':>7}"
        )
        print(out.read_text(), end="")


if __name__ == "__main__":
    main()
