"""The lab's training job: `examples/train_resilient.py`'s loop on gpuvigil.training, with a
step that takes `--step-ms` (the compute a real step stands for), so a fault finds the job
mid-run. Run by the lab's pods, one process per rank (the in-process restart's job,
`deploy/kubernetes/examples/training-job-inprocess.yaml`), or under the launcher (the
whole-gang job, `training-job.yaml`):

    python -m gpuvigil.training.launch --nnodes 2 --nproc-per-node 1 ... \
        -m gpuvigil.lab.workload --steps 200 --step-ms 100 --checkpoint-dir D --checkpoint-every 20

What lives outside `train` (data, module, optimizer, sampler) is the process's state, which
a survivor of an in-process restart keeps; without `restart.in_process`, `in_process` is
`init`, `train`, `shutdown`.

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
from gpuvigil.training.inprocess import in_process


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--step-ms", type=float, default=100.0, help="what a step costs, in ms")
    p.add_argument("--checkpoint-dir", required=True, help="checkpoint folder")
    p.add_argument("--checkpoint-every", type=int, default=20, help="save every K steps")
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(message)s")
    config = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": args.checkpoint_dir, "every_steps": args.checkpoint_every}}
    )
    torch.manual_seed(0)
    x = torch.randn(1024, 32)
    y = x @ torch.randn(32, 1)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    sampler = training.ResumableSampler(len(x), rank=rank, world_size=world, batch_size=16)

    def train(env: training.Env) -> None:
        model = DistributedDataParallel(net.to(env.device))  # on this generation's group
        with training.Run(env, model=model, optimizer=optimizer, sampler=sampler) as run:
            for _ in run.steps(args.steps):
                started = time.monotonic()
                idx = sampler.current_batch()
                loss = nn.functional.mse_loss(model(x[idx]), y[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                time.sleep(max(0.0, args.step_ms / 1000 - (time.monotonic() - started)))

    in_process(train, config)


if __name__ == "__main__":
    main()
