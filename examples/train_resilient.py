"""Train a small deterministic model under torchrun, surviving lost, hung and slow workers.

    torchrun --standalone --nproc-per-node 2 --max-restarts 3 examples/train_resilient.py \
        --steps 200 --checkpoint-dir /tmp/ckpt --checkpoint-every 20 --save-final /tmp/final.pt

Kill any worker (kill -9 <pid>): torchrun restarts the group, training resumes from the last
checkpoint, and the final parameters are bit-identical to an uninterrupted run. Send SIGTERM
to torchrun: every rank finishes its step, saves, and exits with code 89 (DRAINED).
The script needs only gpuvigil[training]: copy it anywhere and run it.
Settings beyond the flags come from GPUVIGIL__TRAINING__* variables (see docs/training.md).
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpuvigil import training


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps")
    p.add_argument("--checkpoint-dir", help="checkpoint folder or fsspec URL (none: no resume)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="save every K steps")
    p.add_argument("--save-final", help="rank 0 writes the final parameters here (torch.save)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(message)s"
    )

    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    env = training.init(config)  # health gate, then a process group that survives restarts

    torch.manual_seed(0)  # the same data and initial weights on every rank and every run
    x = torch.randn(4096, 32)
    y = x @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    model = DistributedDataParallel(net.to(env.device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    sampler = training.ResumableSampler(
        len(x), rank=env.rank, world_size=env.world_size, batch_size=args.batch_size
    )

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

    if env.rank == 0 and args.save_final:
        torch.save(net.state_dict(), args.save_final)
        logging.info("trained %d steps; final parameters in %s", args.steps, args.save_final)
    training.shutdown()


if __name__ == "__main__":
    main()
