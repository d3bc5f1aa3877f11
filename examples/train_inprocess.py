"""Train train_resilient.py's model with one process per rank, the survivors keeping their
processes when a rank is lost (in-process restart; docs/training.md).

    python -m gpuvigil.training.inprocess serve --port 29400 &     # the job's store
    for r in 0 1; do
      RANK=$r WORLD_SIZE=2 GPUVIGIL__TRAINING__RESTART__IN_PROCESS=true \
      GPUVIGIL__TRAINING__RESTART__STORE=127.0.0.1:29400 GPUVIGIL__TRAINING__MEMTIER__ENABLED=true \
      GPUVIGIL__TRAINING__MEMTIER__DIR=/tmp/shm/{rank} \
      python examples/train_inprocess.py --steps 200 --checkpoint-dir /tmp/ckpt &
    done

Kill one rank (kill -9 <pid>) and start it again with the same RANK: the other rank keeps
its process, the group re-forms, and training resumes from the newest step both ranks hold
in the in-memory tier. `deploy/kubernetes/examples/training-job-inprocess.yaml` runs it as
an Indexed Job. Settings beyond the flags come from GPUVIGIL__TRAINING__* variables.
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuvigil import training
from gpuvigil.training.inprocess import in_process


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", help="checkpoint folder or fsspec URL (none: no resume)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save every K steps")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(message)s")
    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    # What lives outside `train` is the process's state, which a survivor keeps; the Run
    # rolls it back to the step every rank agreed on.
    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    y = x @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    sampler = training.ResumableSampler(len(x), rank=rank, world_size=world,
                                        batch_size=args.batch_size)  # fmt: skip

    def train(env: training.Env) -> None:  # runs again in this process per generation
        model = DistributedDataParallel(net.to(env.device))  # bound to this generation's group
        with training.Run(
            env, model=model, optimizer=optimizer, scheduler=scheduler, sampler=sampler
        ) as run:
            for _ in run.steps(args.steps):
                idx = sampler.current_batch()
                loss = nn.functional.mse_loss(model(x[idx].to(env.device)), y[idx].to(env.device))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()

    in_process(train, config)


if __name__ == "__main__":
    main()
