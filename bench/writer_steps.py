"""Do the steps after an async save slow down while the writer writes? Issue #24 item 8
(target: the writer never slows the next steps by more than 5% of step time).

    PYTHONPATH=src python bench/writer_steps.py [state MB, default 200]

One process (a 1-rank gloo group), CPU, one intra-op thread for training (a GPU job
leaves host cores idle; the writer process takes another one). A model of about the given
state size trains with plain SGD; the steps are timed in alternation: steps with no save in
flight, and the steps that run while the rank's writer process writes and hashes an async
save (from the save's return until its commit). Prints the medians and the ratio.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from gpuvigil.training import checkpoint
from gpuvigil.training.config import CheckpointConfig


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="gpuvigil-writer-steps-"))
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    width = 1024
    layers = max(1, (mb << 20) // (width * width * 4))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64, width)
    ck = checkpoint.Checkpointer(
        CheckpointConfig(dir=str(tmp / "ckpt"), mode="async", keep_last=2),
        rank=0,
        world_size=1,
        group=dist.group.WORLD,
    )

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        return time.perf_counter() - t0

    def tensors() -> dict[str, object]:
        return {"model": model.state_dict()}

    try:
        ck.prepare(tensors())
        for _ in range(5):
            step()
        quiet: list[float] = []
        busy: list[float] = []
        saves = 0
        for n in range(1, 6):
            quiet += [step() for _ in range(10)]
            ck.save(n, tensors(), {}, {})
            saves += 1
            while ck._pending is not None and not ck._pending.done():
                busy.append(step())
            ck.wait()
        q, b = statistics.median(quiet), statistics.median(busy)
        print(
            f"load average {os.getloadavg()[0]:.1f}; {layers} layers, "
            f"{sum(p.numel() for p in model.parameters()) * 4 / 2**20:.0f} MB of state"
        )
        print(f"steps with no save in flight: {len(quiet)}, median {q * 1e3:.1f} ms")
        print(
            f"steps while the writer wrote: {len(busy)} over {saves} saves, median {b * 1e3:.1f} ms"
        )
        print(f"ratio {b / q:.3f} (target <= 1.05)")
    finally:
        ck.close()
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
