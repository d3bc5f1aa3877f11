"""The two size terms of the simulator's restart model (`sim/restart_phases.yaml`) that the
lab's 2-rank restart cannot show, measured on this machine:

- restore: seconds per byte of a plain `dcp.load` of a rank's state (the read bandwidth the
  model divides a rank's checkpoint bytes by). One process, the checkpoint just written, so
  the page cache holds it: a local upper bound, not a shared file system's share per rank.
- rendezvous: seconds per member of a c10d `TCPStore` round (each member connects to the
  one store and reads the key the first member set, as torchrun's rendezvous and the
  process group's bootstrap do). The store serves members one by one, so the law is linear
  in the world size; the slope is taken between the two largest sizes of the same run
  (on the 2-core machine a round of 64 or 128 members stalled ~10 s in every try, one of
  16 or of 512 and more did not: the small sizes are no anchor for a slope).

    PYTHONPATH=src python bench/restart_scaling.py            # 64 MB; 512, 2048, 4096 members
    PYTHONPATH=src python bench/restart_scaling.py 256 1024 16384   # 256 MB; those members
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed import TCPStore


def read_bandwidth(nbytes: int, repeats: int = 3) -> float:
    """Bytes per second of `dcp.load` into a preallocated state, the median of `repeats`."""
    state = {"w": torch.ones(nbytes // 4, dtype=torch.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        dcp.save(state, checkpoint_id=tmp, no_dist=True)
        times = []
        for _ in range(repeats):
            into = {"w": torch.empty_like(state["w"])}
            t0 = time.perf_counter()
            dcp.load(into, checkpoint_id=tmp, no_dist=True)
            times.append(time.perf_counter() - t0)
            assert torch.equal(into["w"], state["w"])  # a load that read nothing is no figure
    return nbytes / statistics.median(times)


def store_round(members: int) -> float:
    """Seconds for `members` clients to connect to one store and read the first's key."""
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    master.set("rdzv/addr", "10.0.0.1:29500")

    def join(_: int) -> bytes:
        c = TCPStore("127.0.0.1", master.port, is_master=False, wait_for_workers=False)
        return c.get("rdzv/addr")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(join, range(members)))
    took = time.perf_counter() - t0
    assert all(g == b"10.0.0.1:29500" for g in got)
    return took


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    sizes = [int(a) for a in sys.argv[2:]] or [512, 2048, 4096]
    bw = read_bandwidth(mb << 20)
    print(f"dcp.load of {mb} MB: {bw / 1e6:,.0f} MB/s (median of 3, page cache warm)")
    rounds = {n: min(store_round(n) for _ in range(3)) for n in sizes}
    for n, s in rounds.items():
        print(f"store round, {n:>6} members: {s:.3f} s ({s / n * 1e3:.3f} ms/member)")
    if len(rounds) < 2:
        return
    lo, hi = sorted(rounds)[-2:]
    slope = (rounds[hi] - rounds[lo]) / (hi - lo)
    print(f"slope {lo}->{hi} members: {slope * 1e3:.3f} ms/member (best of 3 each)")


if __name__ == "__main__":
    main()
