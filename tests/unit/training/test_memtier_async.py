"""The in-memory tier's copy runs off the training thread (issue #24 item 4): a save returns
after the snapshot, the next save and a restore wait for the copy in flight, a copy that
fails is reported at the next save (not lost), and the blob is the one `pack` makes."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.training.config import MemTierConfig

torch = pytest.importorskip("torch")

from gpuvigil.training import memtier  # noqa: E402  (torch first: skipped without it)

STATE = {"rank": 0, "world_size": 1, "rank_state": {}, "job": {}}


class Gate:
    """Holds the tier's thread in `_put` until opened, or makes `_put` fail."""

    def __init__(self, tier: memtier.MemTier) -> None:
        self.real, self.open, self.fail = tier._put, threading.Event(), False
        self.entered = threading.Event()
        tier._put = self.put  # type: ignore[method-assign]

    def put(self, *args: Any) -> None:
        self.entered.set()
        assert self.open.wait(10), "the gate was never opened"
        if self.fail:
            raise OSError(28, "No space left on device (injected)")
        self.real(*args)

    def open_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.open.set).start()


def _tier(tmp_path: Path, **kw: Any) -> memtier.MemTier:
    cfg = MemTierConfig(enabled=True, dir=str(tmp_path / "{rank}"), keep_last=2)
    return memtier.MemTier(cfg, rank=0, world_size=1, group=None, job="j", node="n", **kw)


def _tensors(v: float) -> dict[str, Any]:
    return {"w": torch.full((1000,), v), "b": torch.arange(4, dtype=torch.bfloat16)}


def test_save_returns_after_the_snapshot_and_the_next_save_waits(
    tmp_path: Path, one_rank: Any
) -> None:
    tier = _tier(tmp_path)
    gate = Gate(tier)
    state = _tensors(1.0)
    assert tier.save(1, state, STATE) > 0  # returns with the copy still held at the gate
    assert gate.entered.wait(5) and tier.in_flight == 1
    assert not (tier.holder / "own-r00000-s000000001.bin").exists()
    assert tier._thread is not None and tier._thread.daemon
    assert tier._thread.name == "gpuvigil-memtier-r0"
    state["w"].fill_(7.0)  # the next optimizer step: the snapshot already has step 1's values
    gate.open_after(0.3)
    t0 = time.monotonic()
    tier.save(2, state, STATE)  # waits for step 1's copy first: that wait is the stall
    assert time.monotonic() - t0 >= 0.25
    assert tier.held == 1
    got, why = tier.restore({"w", "b"})  # waits for step 2's copy
    assert got is not None, why
    assert got.step == 2 and torch.equal(got.flat["w"], torch.full((1000,), 7.0))
    header, flat = memtier.unpack((tier.holder / "own-r00000-s000000001.bin").read_bytes())
    assert torch.equal(flat["w"], torch.full((1000,), 1.0))  # step 1's snapshot, not later
    # the same bytes as the synchronous `pack` of the same state (the format is unchanged)
    assert (tier.holder / "own-r00000-s000000002.bin").read_bytes() == memtier.pack(
        2, state, {"skeleton": header["skeleton"], **STATE}
    )
    tier.close()
    assert tier._thread is None


def test_restore_waits_for_the_copy_in_flight(tmp_path: Path, one_rank: Any) -> None:
    tier = _tier(tmp_path)
    gate = Gate(tier)
    gate.open.set()
    tier.save(1, _tensors(1.0), STATE)
    assert tier.wait()
    gate.open.clear()
    tier.save(2, _tensors(2.0), STATE)
    gate.open_after(0.3)
    got, why = tier.restore({"w", "b"})
    assert got is not None and got.step == 2, why
    tier.close()


def test_a_failed_copy_is_reported_at_the_next_save_and_the_tier_holds_the_step_before(
    tmp_path: Path, one_rank: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tier = _tier(tmp_path)
    gate = Gate(tier)
    gate.open.set()
    tier.save(1, _tensors(1.0), STATE)
    assert tier.wait() and tier.held == 1
    gate.fail = True
    tier.save(2, _tensors(2.0), STATE)  # fails on the tier's thread: save itself returns
    assert tier._inflight is not None and tier._inflight.done.wait(5)
    assert tier.failures == 0  # not yet reported: the next save does
    gate.fail = False
    with caplog.at_level(logging.WARNING, logger="gpuvigil.training.checkpoint"):
        tier.save(3, _tensors(3.0), STATE)
    assert "copy of step 2 failed (OSError" in caplog.text
    assert "holds step 1" in caplog.text
    assert tier.failures == 1
    # step 3's copy may still be writing its own .tmp: look once it is done
    assert tier.wait() and tier.held == 3
    assert not list(tier.holder.glob("*.tmp"))  # no half copy left
    assert sorted(tier._copies("own", 0)) == [1, 3]
    tier.close()


def test_a_copy_stuck_past_the_bound_skips_the_next_save_without_raising(
    tmp_path: Path, one_rank: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tier = _tier(tmp_path, wait_s=0.2)
    gate = Gate(tier)
    tier.save(1, _tensors(1.0), STATE)
    with caplog.at_level(logging.WARNING, logger="gpuvigil.training.checkpoint"):
        assert tier.save(2, _tensors(2.0), STATE) == 0
        got, why = tier.restore({"w", "b"})
    assert got is None and "still in flight" in why
    assert "copy of step 1 is not done after 0s" in caplog.text
    assert "skips the copy of step 2" in caplog.text
    gate.open.set()
    tier.close()
    assert tier.held == 1 and tier._thread is None


def test_the_snapshot_buffer_is_reused_while_the_sizes_match(tmp_path: Path) -> None:
    tier = _tier(tmp_path)
    first = tier.save(1, _tensors(1.0), STATE)
    buf = tier._buf
    assert tier.wait()
    # a longer header (more steps, more state) in the same buffer: the reserve absorbs it
    assert tier.save(123456, _tensors(2.0), {**STATE, "job": {"x": list(range(50))}}) > first
    assert tier._buf is buf
    assert tier.wait()
    tier.save(3, {"w": torch.zeros(10)}, STATE)  # other tensors: a new buffer
    assert tier._buf is not buf
    tier.close()
