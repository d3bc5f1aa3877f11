"""PyTorch Lightning with gpuvigil: one callback, and `ckpt_path="last"` to resume.

    python -m gpuvigil.training.launch --standalone --nproc-per-node 2 --max-restarts 3 \
        examples/train_lightning.py --steps 200 --checkpoint-dir /tmp/ckpt-pl

The lines that differ from a plain Lightning script are marked (1)-(4):
(1) `Resilience()` in the callbacks: health gate, hang watchdog and the launcher's monitor,
    stragglers, the job's events, and a drain (SIGTERM: save `last.ckpt`, exit 89);
(2) a ModelCheckpoint with `save_last=True` where the drain's checkpoint goes too;
(3) `ckpt_path="last"`: every (re)start resumes from the newest of them;
(4) a `ResumableLoader`: its position goes in the checkpoint, so a resume in the middle of
    an epoch ends with the same weights as an uninterrupted run (`Resilience` refuses a
    plain DataLoader); each rank reads its share, so Lightning's DistributedSampler is off.
Launch it with gpuvigil's launcher (or torchrun): Lightning uses the ranks torchrun made.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

import torch
from pytorch_lightning import LightningModule, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import TensorDataset

from gpuvigil.training import ResumableSampler
from gpuvigil.training.lightning import Resilience
from gpuvigil.training.loader import ResumableLoader


class Regression(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader(samples: int = 4096, batch_size: int = 16, **kwargs: Any) -> ResumableLoader:  # (4)
    torch.manual_seed(0)
    x = torch.randn(samples, 32)
    data = TensorDataset(x, x @ torch.randn(32, 1))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    sampler = ResumableSampler(len(data), rank=rank, world_size=world, batch_size=batch_size)
    return ResumableLoader(data, sampler, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--save-final", help="rank 0 writes the final parameters here")
    args = p.parse_args()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(message)s"
    )
    data = loader()
    trainer = Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "auto",
        use_distributed_sampler=False,  # (4)
        callbacks=[
            Resilience(),  # (1)
            ModelCheckpoint(  # (2)
                dirpath=args.checkpoint_dir,
                save_last=True,
                every_n_train_steps=args.checkpoint_every,
            ),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = os.path.join(args.checkpoint_dir, "last.ckpt")
    model = Regression()
    trainer.fit(model, data, ckpt_path="last" if os.path.exists(last) else None)  # (3)
    if trainer.global_rank == 0 and args.save_final:
        torch.save(model.state_dict(), args.save_final)


if __name__ == "__main__":
    main()
