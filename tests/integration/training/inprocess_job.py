"""The in-process restart tests' job: train_resilient.py's model and data, one process per
rank (started by the test, as a Kubernetes indexed Job starts one pod per rank), under
`training.in_process(train)`.

What lives outside `train` (the data, the module, the optimizer, the scheduler, the sampler)
is the process's in-memory state that a survivor keeps across generations; `train` wraps
the module in DDP on the generation's group and runs the `Run`, which rolls everything back
to the step every rank agreed on. Each completed step appends a JSON line (rank, pid,
generation, step, time) to --progress, for the test to read from outside.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuvigil import training
from gpuvigil.training.inprocess import in_process


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--save-final")
    p.add_argument("--progress", required=True)
    p.add_argument("--step-sleep", type=float, default=0.05, help="seconds per step")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stacks on a timeout
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(message)s")
    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    y = x @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    sampler = training.ResumableSampler(len(x), rank=rank, world_size=world, batch_size=16)
    progress = open(args.progress, "a", buffering=1)  # noqa: SIM115 - one line per step

    def train(env: training.Env) -> None:
        # Bound to this generation's group. One bucket per parameter: with 3 ranks a ring
        # all-reduce adds three numbers in an order set by where a gradient sits in its
        # bucket, and DDP's first iteration lays its buckets out in another order than the
        # later ones (it rebuilds them after the first): any restart, in-process or cold,
        # would otherwise round differently (with 2 ranks a + b == b + a, so it cannot).
        model = DistributedDataParallel(net, bucket_cap_mb_list=[1e-6])
        with training.Run(
            env, model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler
        ) as run:
            for step in run.steps(args.steps):
                idx = sampler.current_batch()
                loss = nn.functional.mse_loss(model(x[idx]), y[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                time.sleep(args.step_sleep)
                line = {"rank": rank, "pid": os.getpid(), "gen": env.restart_count}
                progress.write(json.dumps({**line, "step": step + 1, "ts": time.time()}) + "\n")

    in_process(train, config)
    if rank == 0 and args.save_final:
        torch.save(net.state_dict(), args.save_final)


if __name__ == "__main__":
    main()
