"""The async writer process on a data file of more than one span (issue #24 item 8): the
real writer (the process an async save runs, which the SPAN monkeypatch of
test_span_digests cannot reach) hashes an 80 MiB tensor as two 64 MiB spans, a `Run`
restores from them, and one flipped byte in the second span is named with its checkpoint
and its span, and the job falls back to the previous checkpoint."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.training import manifest
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.storage import SPAN

torch = pytest.importorskip("torch")

ROWS, COLS = 5120, 4096  # float32: 80 MiB, one span and a quarter


def _run(ckpt: Path, group: Any, model: Any) -> Any:
    """A `Run` of one rank in this process, as `training.init` would make it, saving async."""
    from gpuvigil.training.process_group import Env
    from gpuvigil.training.run import Run

    config = TrainingConfig.model_validate(
        {
            "checkpoint": {"dir": str(ckpt), "mode": "async", "every_steps": 1, "keep_last": 2},
            "watchdog": {"enabled": False},
            "health_gate": {"enabled": False},
        }
    )
    env = Env(rank=0, world_size=1, local_rank=0, node="vm", device=torch.device("cpu"),
              restart_count=0, round_key="attempt-0", job="j", config=config,
              groups={"checkpoint": group, "monitor": group, "memtier": group})  # fmt: skip
    return Run(env, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def _model() -> Any:
    return torch.nn.Linear(COLS, ROWS, bias=False)


def test_the_writer_process_hashes_two_spans_and_a_flip_in_the_second_is_named(
    tmp_path: Path, one_rank: Any, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    model = _model()
    weights = {}
    with _run(ckpt, one_rank, model) as run:
        assert run._ckpt._writer is not None  # the writer process, not the in-process path
        for step in run.steps(2):
            with torch.no_grad():
                model.weight.add_(1.0)  # a cheap "training step" that changes every byte
            weights[step + 1] = model.weight.detach().clone()

    s1, s2 = (ckpt / manifest.dir_name(n) for n in (1, 2))
    data = s2 / "__0_0.distcp"
    entry = json.loads((s2 / manifest.MANIFEST).read_text())["files"][data.name]
    raw = data.read_bytes()
    assert entry["size"] == len(raw) >= ROWS * COLS * 4 > SPAN
    assert entry["span_bytes"] == SPAN
    # The writer's digests, checked against the bytes on disk by an independent hash.
    assert entry["sha256_spans"] == [
        hashlib.sha256(raw[at : at + SPAN]).hexdigest() for at in range(0, len(raw), SPAN)
    ]
    assert len(entry["sha256_spans"]) == 2

    fresh = _model()
    with _run(ckpt, one_rank, fresh) as run:
        assert run.start_step == 2
    assert torch.equal(fresh.weight, weights[2])

    damaged = bytearray(raw)
    damaged[SPAN + 12345] ^= 0x01  # one bit, in the second span
    data.write_bytes(bytes(damaged))
    again = _model()
    with caplog.at_level(logging.INFO), _run(ckpt, one_rank, again) as run:
        assert run.start_step == 1  # the previous checkpoint, verified
    assert torch.equal(again.weight, weights[1])
    (warning,) = [r.getMessage() for r in caplog.records if "is DAMAGED" in r.getMessage()]
    assert warning.startswith(f"gpuvigil checkpoint: {s2.name} is DAMAGED")
    assert f"file __0_0.distcp fails its SHA-256 check at bytes {SPAN}-{len(raw)}" in warning
    assert (ckpt / f"damaged-{s2.name}").is_dir() and s1.is_dir()  # kept, set aside
