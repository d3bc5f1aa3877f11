"""Pipeline parallelism with gpuvigil: each rank holds several model parts (torchtitan style).

    python -m gpuvigil.training.launch --standalone --nproc-per-node 2 --max-restarts 3 \
        examples/train_pipeline.py --steps 40 --checkpoint-dir /tmp/ckpt-pp

Four stages on two ranks, interleaved 1F1B: rank 0 holds stages 0 and 2, rank 1 stages 1
and 3. What changes from a single-model script is one line: `Run(model=parts,
optimizer=optimizers, scheduler=schedulers)` takes the lists. Each part keeps the model's
own parameter names (the copy keeps only its layers), so every rank checkpoints its own
parts and resumes them exactly. `run.extra` holds per-rank state (here, the losses this
rank has seen) and comes back on the same rank.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

from gpuvigil import training

STAGES, WIDTH, MICROBATCHES = 4, 32, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict(
            {str(i): nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for i in range(STAGES)}
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


def part(model: Net, stage: int) -> Net:
    """A copy of the model with only `stage`'s layer: parameter names stay the model's."""
    p = copy.deepcopy(model)
    for i in list(p.layers):
        if int(i) != stage:
            del p.layers[i]
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--save-final", help="each rank writes its parts here ({rank} replaced)")
    args = ap.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(message)s"
    )
    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    env = training.init(config)
    torch.manual_seed(0)
    model = Net()
    x, y = torch.randn(64, WIDTH), torch.randn(64, WIDTH)

    mine = list(range(env.rank, STAGES, env.world_size))  # rank 0: stages 0, 2; rank 1: 1, 3
    parts = [part(model, s) for s in mine]
    stages = [PipelineStage(p, s, STAGES, env.device) for p, s in zip(parts, mine, strict=True)]
    schedule = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=nn.functional.mse_loss)
    optimizers = [torch.optim.AdamW(p.parameters(), lr=1e-2) for p in parts]
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=10, gamma=0.9) for o in optimizers]

    with training.Run(
        env, model=parts, optimizer=optimizers, scheduler=schedulers, extra={"losses": 0}
    ) as run:
        for _ in run.steps(args.steps):
            losses: list[torch.Tensor] = []
            if 0 in mine:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=losses)
            for o in optimizers:
                o.step()
                o.zero_grad()
            for s in schedulers:
                s.step()
            run.extra["losses"] += len(losses)  # per-rank state, restored on this rank

    if args.save_final:
        state = {k: v for p in parts for k, v in p.state_dict().items()}
        torch.save(state, args.save_final.format(rank=env.rank))
    training.shutdown()


if __name__ == "__main__":
    main()
