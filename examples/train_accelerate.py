"""HF Accelerate with gpuvigil: gradient accumulation, exact resume, restarts that hold.

    python -m gpuvigil.training.launch --standalone --nproc-per-node 2 --max-restarts 3 \
        examples/train_accelerate.py --steps 40 --accumulate 4 --checkpoint-dir /tmp/ckpt-acc

The lines that differ from a plain Accelerate script, and why:
1. `env = training.init(config)` comes before `Accelerator(...)`: gpuvigil forms the
   process group (health gate, restart-safe store) and Accelerate uses it as it finds it.
2. `accelerator.prepare(model, optimizer)`: not the DataLoader. The ResumableSampler
   already gives each rank its own samples; prepare() would shard them a second time.
   Not the LR scheduler either: Accelerate would step it once per process per step.
3. One `run.steps()` step is one *optimizer* step: `--accumulate` micro-batches inside
   `accelerator.accumulate(model)`. The sampler's batch is micro-batch x accumulate, so
   the step count, the sample count and the checkpoint position stay exact.
4. `training.Run(env, model=model, optimizer=optimizer.optimizer, ...)`: the torch
   optimizer inside Accelerate's wrapper.
The global batch is micro-batch x accumulate x world size: resuming at another world
size changes it, and so the trajectory (docs/training.md).
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
from accelerate import Accelerator
from torch import nn

from gpuvigil import training


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per step")
    p.add_argument("--micro-batch", type=int, default=8, help="samples per rank per micro-batch")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--save-final", help="rank 0 writes the final parameters here")
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(message)s"
    )
    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    env = training.init(config)  # (1)
    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, cpu=True)

    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    y = x @ torch.randn(32, 1) + 0.1 * torch.randn(4096, 1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    model, optimizer = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=1e-2))  # (2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer.optimizer, step_size=10, gamma=0.9)
    sampler = training.ResumableSampler(
        len(x),
        rank=env.rank,
        world_size=env.world_size,
        batch_size=args.micro_batch * args.accumulate,  # (3)
    )

    with training.Run(
        env,
        model=model,
        optimizer=optimizer.optimizer,
        scheduler=scheduler,
        sampler=sampler,  # (4)
    ) as run:
        for _ in run.steps(args.steps):
            batch = torch.tensor(sampler.current_batch())
            for micro in batch.chunk(args.accumulate):  # (3)
                with accelerator.accumulate(model):
                    loss = nn.functional.mse_loss(model(x[micro]), y[micro])
                    accelerator.backward(loss)
                    optimizer.step()  # applies only on the last micro-batch
                    optimizer.zero_grad()
            scheduler.step()

    if env.rank == 0 and args.save_final:
        torch.save(accelerator.unwrap_model(model).state_dict(), args.save_final)
    training.shutdown()


if __name__ == "__main__":
    main()
