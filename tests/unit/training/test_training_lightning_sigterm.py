"""The Lightning callback owns SIGTERM during fit and gives it back after (one real Trainer,
one CPU process; the 2-rank drains run on torchrun in tests/integration/training)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from testkit import lightning_example


def _fit(tmp_path: Path, *, on_batch: Any, steps: int = 5) -> Any:
    example = lightning_example()
    from pytorch_lightning import Callback, Trainer

    from gpuvigil.training.config import TrainingConfig
    from gpuvigil.training.lightning import Resilience

    class Probe(Callback):  # type: ignore[misc]
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            on_batch(trainer)

    cfg = TrainingConfig.load(
        environ={},
        overrides={"health_gate": {"on_missing": "allow", "state_file": str(tmp_path / "no")}},
    )
    trainer = Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        callbacks=[Resilience(cfg), Probe()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(example.Regression(), example.loader(samples=64, batch_size=8))
    return trainer


def test_sigterm_is_the_drains_during_fit_and_the_previous_handler_after(tmp_path: Path) -> None:
    """Lightning's handler broadcast inside the signal handler (it deadlocked 2-rank jobs):
    during fit SIGTERM reaches the drain's flag-only handler alone, and after fit the
    handler from before it is back (else a later SIGTERM would be swallowed)."""

    def mine(signum: int, frame: Any) -> None:
        pass

    seen: list[Any] = []
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        _fit(tmp_path, on_batch=lambda trainer: seen.append(signal.getsignal(signal.SIGTERM)))
        assert seen and all(getattr(h, "__name__", "") == "handle" for h in seen), seen
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_in_a_batch_saves_that_step_and_exits_drained(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGTERM)

    def term_at_step_2(trainer: Any) -> None:
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as ended:
        _fit(tmp_path, on_batch=term_at_step_2, steps=50)
    assert ended.value.code == exit_codes.DRAINED
    assert getattr(ended.value, "step", None) == 3  # the batch under way finished
    assert (tmp_path / "last.ckpt").exists()
    assert signal.getsignal(signal.SIGTERM) is previous
