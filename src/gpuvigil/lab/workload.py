"""The lab's training job: `examples/train_resilient.py`'s loop on gpuvigil.training, with a
step that takes `--step-ms` (the compute a real step stands for), so a fault finds the job
mid-run. Run by the lab's pods under `python -m gpuvigil.training.launch`:

    python -m gpuvigil.training.launch --nnodes 2 --nproc-per-node 1 ... \
        -m gpuvigil.lab.workload --steps 200 --step-ms 100 --checkpoint-dir D --checkpoint-every 20

Everything that matters to the lab is the library's: the health gate, the process group
that survives restarts, checkpoints, the hang watchdog, the drain on SIGTERM and the
job's lifecycle events.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuvigil import training


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--step-ms", type=float, default=100.0, help="what a step costs, in ms")
    p.add_argument("--checkpoint-dir", required=True, help="checkpoint folder")
    p.add_argument("--checkpoint-every", type=int, default=20, help="save every K steps")
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(message)s"
    )
    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    env = training.init(config)
    torch.manual_seed(0)
    x = torch.randn(1024, 32)
    y = x @ torch.randn(32, 1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    model = DistributedDataParallel(net.to(env.device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = training.ResumableSampler(len(x), rank=env.rank, world_size=env.world_size,
                                        batch_size=16)  # fmt: skip
    with training.Run(env, model=model, optimizer=optimizer, sampler=sampler) as run:
        for _ in run.steps(args.steps):
            started = time.monotonic()
            idx = sampler.current_batch()
            loss = nn.functional.mse_loss(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(max(0.0, args.step_ms / 1000 - (time.monotonic() - started)))
    training.shutdown()


if __name__ == "__main__":
    main()
