"""Resumable sampler (position survives a resize) and the training config loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuvigil.core.config import ConfigError
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.sampler import ResumableSampler


def samplers(world: int, **kw: int) -> list[ResumableSampler]:
    return [
        ResumableSampler(100, rank=r, world_size=world, batch_size=4, **kw) for r in range(world)
    ]


def test_ranks_read_disjoint_samples_covering_the_epoch() -> None:
    ss = samplers(3)
    seen: list[int] = []
    for _ in range(8):  # 8 steps * 12 = 96 usable samples
        for s in ss:
            seen += s.current_batch()
            s.advance()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 96
    assert all(s.epoch == 1 and s.consumed == 0 for s in ss)


def test_resize_continues_at_the_same_global_position() -> None:
    order = ResumableSampler(100, rank=0, world_size=1, batch_size=1)._order(0)
    four = samplers(4)
    taken: list[int] = []
    for _ in range(2):
        for s in four:
            taken += s.current_batch()
            s.advance()
    state = four[0].state_dict()
    two = samplers(2)
    for s in two:
        s.load_state_dict(state)
    for s in two:
        taken += s.current_batch()
    assert sorted(taken) == sorted(order[:40])  # 32 before the resize, 8 after: no gaps


def test_dataloader_protocol_yields_the_rest_of_the_epoch() -> None:
    s = ResumableSampler(20, rank=1, world_size=2, batch_size=2)
    s.advance()
    assert len(list(s)) == len(s) == 8


def test_config_from_env_and_unknown_keys(tmp_path: Path) -> None:
    env = {
        "GPUVIGIL__TRAINING__CHECKPOINT__EVERY_STEPS": "7",
        "GPUVIGIL__AGENT__INTERVAL_S": "5",  # another component's setting: ignored here
        "GPUVIGIL_EVENTS_FILE": str(tmp_path / "ev.jsonl"),
    }
    cfg = TrainingConfig.load(environ=env, overrides={"checkpoint": {"dir": "/c"}})
    assert cfg.checkpoint.every_steps == 7 and cfg.checkpoint.dir == "/c"
    assert cfg.events_file == tmp_path / "ev.jsonl"
    f = tmp_path / "t.yaml"
    f.write_text("training:\n  watchdog:\n    timeout_seconds: 3\n")
    with pytest.raises(ConfigError, match="watchdog.timeout_seconds: unknown key"):
        TrainingConfig.load(f, environ={})
