"""An FSDP2 (fully_shard, DTensor) job for the tests, with the examples' command line."""

from __future__ import annotations

import argparse
import logging
import os

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from gpuvigil import training

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int)
p.add_argument("--checkpoint-dir")
p.add_argument("--checkpoint-every", type=int)
p.add_argument("--save-final")
args = p.parse_args()
logging.basicConfig(
    level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK')} %(message)s"
)
config = training.TrainingConfig.load(
    overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
)
env = training.init(config)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
for layer in (model[0], model[2]):
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(8, 16)
with training.Run(env, model=model, optimizer=optimizer) as run:
    for _ in run.steps(args.steps):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert run._ckpt is not None
    logging.info(
        "staging: %d layout(s) for %s state",
        run._ckpt._stager.layouts,
        type(model[0].weight).__name__,
    )
full = {k: v.full_tensor() for k, v in model.state_dict().items()}
if env.rank == 0 and args.save_final:
    torch.save(full, args.save_final)
training.shutdown()
