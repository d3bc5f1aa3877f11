"""Lightning resumes mid-epoch exactly with the example's loader, and refuses a plain
DataLoader (one CPU process, real Trainers; 8 batches an epoch, so step 11 is mid-epoch)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from testkit import lightning_example

STEPS, STOP = 20, 11  # 2.5 epochs of 8 batches; the stop is 3 batches into the second


def _example() -> ModuleType:
    return lightning_example()


def _fit(
    tmp_path: Path,
    ckpt_dir: Path,
    *,
    loader: Any = None,
    ckpt_path: Path | None = None,
    every: int | None = None,
    on_batch: Any = None,
    **resilience: Any,
) -> Any:
    """One fit of the example's model to STEPS; its final weights."""
    example = _example()
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    from gpuvigil.training.config import TrainingConfig
    from gpuvigil.training.lightning import Resilience

    class Probe(Callback):  # type: ignore[misc]
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            if on_batch is not None:
                on_batch(trainer)

    cfg = TrainingConfig.load(
        environ={},
        overrides={"health_gate": {"on_missing": "allow", "state_file": str(tmp_path / "no")}},
    )
    data = loader if loader is not None else example.loader(samples=64, batch_size=8)
    model = example.Regression()
    trainer = Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        devices=1,
        use_distributed_sampler=False,
        callbacks=[
            Resilience(cfg, **resilience),
            Probe(),
            ModelCheckpoint(
                dirpath=ckpt_dir, save_last=True, every_n_train_steps=every, save_top_k=-1
            ),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, data, ckpt_path=str(ckpt_path) if ckpt_path else None)
    return [p.detach().clone() for p in model.parameters()]


def _equal(a: list[Any], b: list[Any]) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_plain_dataloader_is_refused_and_named(tmp_path: Path) -> None:
    _example()
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpuvigil.training.lightning import NotResumable

    x = torch.randn(64, 32)
    plain = DataLoader(TensorDataset(x, x[:, :1]), batch_size=8, shuffle=True)
    with pytest.raises(NotResumable) as refused:
        _fit(tmp_path, tmp_path / "c", loader=plain)
    text = str(refused.value)
    assert refused.value.code == 92  # NOT_RESUMABLE: the Job fails at once, never retried
    assert "train dataloader 0 (DataLoader) has no state_dict/load_state_dict" in text
    assert "ResumableLoader" in text and "allow_inexact_resume=True" in text
    assert not list(tmp_path.glob("**/*.ckpt"))  # refused before the first step


def test_not_resumable_reasons() -> None:
    _example()
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpuvigil.training import ResumableSampler
    from gpuvigil.training.lightning import not_resumable
    from gpuvigil.training.loader import ResumableLoader

    data = TensorDataset(torch.zeros(64, 1))
    sampler = ResumableSampler(64, rank=0, world_size=2, batch_size=8)
    good = ResumableLoader(data, sampler)
    assert not_resumable([good], rank=0, world_size=2) == []
    assert "rank 0 of 2, but this is rank 1 of 2" in not_resumable([good], rank=1, world_size=2)[0]
    good.load_state_dict({"epoch": 0, "consumed": 32})  # 2 global batches of 16
    (why,) = not_resumable([good], rank=0, world_size=2, batches_done=3)
    assert "2 batches into its epoch but Lightning 3" in why
    (why,) = not_resumable([DataLoader(data, sampler=sampler, batch_size=8)], rank=0, world_size=2)
    assert "ResumableSampler's state is not one Lightning saves" in why
    with pytest.raises(TypeError, match="use_distributed_sampler=False"):
        ResumableLoader(data, sampler=None)  # type: ignore[arg-type]


def test_the_opt_out_trains_a_plain_dataloader(tmp_path: Path) -> None:
    _example()
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.randn(64, 32)
    plain = DataLoader(TensorDataset(x, x[:, :1]), batch_size=8)
    assert _fit(tmp_path, tmp_path / "c", loader=plain, allow_inexact_resume=True)


def test_mid_epoch_resume_after_a_kill_is_bitwise_exact(tmp_path: Path) -> None:
    """Uninterrupted to step 20, saving step 11 on the way (what a kill then leaves), against
    a resume from that checkpoint: the same weights, bit for bit. Two workers draw indices
    ahead of training, so a position counted where indices are drawn would be ahead; a plain
    DataLoader (with the opt-out) read the epoch again and ended with other weights."""
    ex = _example()
    whole = _fit(
        tmp_path / "a", tmp_path / "a/c", every=STOP, loader=ex.loader(64, 8, num_workers=2)
    )
    (at_stop,) = (tmp_path / "a/c").glob(f"*step={STOP}.ckpt")
    killed = _fit(
        tmp_path / "b", tmp_path / "b/c", ckpt_path=at_stop, loader=ex.loader(64, 8, num_workers=2)
    )
    assert _equal(whole, killed)


def test_mid_epoch_resume_after_a_drain_is_bitwise_exact(tmp_path: Path) -> None:
    """SIGTERM in the batch of step 11: the drain saves that step's end, mid-epoch, and the
    resume from it ends with the uninterrupted run's weights, bit for bit."""
    whole = _fit(tmp_path / "a", tmp_path / "a/c")

    def term(trainer: Any) -> None:
        if trainer.global_step == STOP - 1:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as ended:
        _fit(tmp_path / "d", tmp_path / "d/c", on_batch=term)
    assert ended.value.code == exit_codes.DRAINED
    assert getattr(ended.value, "step", None) == STOP
    drained = _fit(tmp_path / "d", tmp_path / "d/c", ckpt_path=tmp_path / "d/c/last.ckpt")
    assert _equal(whole, drained)


def test_resume_at_an_epoch_end_continues_the_next_epoch_exactly(tmp_path: Path) -> None:
    whole = _fit(tmp_path / "a", tmp_path / "a/c", every=8)
    (at_end,) = (tmp_path / "a/c").glob("*step=8.ckpt")
    assert _equal(whole, _fit(tmp_path / "b", tmp_path / "b/c", ckpt_path=at_end))
