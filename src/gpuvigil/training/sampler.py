"""A resumable, resizable data order: which samples each rank reads, from any position.

Passed by the user's script to `DataLoader(sampler=...)` and to `Run(sampler=...)`, which
saves and restores its position. The position is *global*: `consumed` counts samples taken
by all ranks together, so it stays meaningful when the world size changes between restarts.
Epoch e visits a permutation of the dataset seeded by (seed, e); from position p, rank r of
W ranks reads permutation[p + r], [p + r + W], ... in steps of W. After a resize from W to
W', the job continues at the same global position: no sample of the epoch is skipped or
repeated. The tail of an epoch too short for a whole global batch is dropped (like
`drop_last=True`), so an epoch's last samples depend on the world size at its end.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any


class ResumableSampler:
    def __init__(
        self,
        dataset_len: int,
        *,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if dataset_len < batch_size * world_size:
            raise ValueError("dataset smaller than one global batch")
        self.dataset_len, self.rank, self.world_size = dataset_len, rank, world_size
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.epoch = 0
        self.consumed = 0  # samples of this epoch taken by all ranks together

    def _order(self, epoch: int) -> list[int]:
        idx = list(range(self.dataset_len))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(idx)
        return idx

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def current_batch(self) -> list[int]:
        """This rank's indices for the step about to run (the position is not moved)."""
        start = self.consumed + self.rank
        return self._order(self.epoch)[start : self.consumed + self.global_batch : self.world_size]

    def advance(self) -> None:
        """Called by `Run` after each completed step: the saved position is always the
        position of the next step to run, whatever a DataLoader prefetched."""
        self.consumed += self.global_batch
        self._roll()

    def _roll(self) -> None:
        # The tail of an epoch too short for a whole global batch is dropped (drop_last).
        if self.consumed + self.global_batch > self.dataset_len:
            self.epoch, self.consumed = self.epoch + 1, 0

    def __iter__(self) -> Iterator[int]:
        """DataLoader(sampler=...) protocol: this rank's indices from the position to the end
        of its epoch (use with `batch_size=` this sampler's batch_size)."""
        order, consumed = self._order(self.epoch), self.consumed
        while consumed + self.global_batch <= self.dataset_len:
            yield from order[consumed + self.rank : consumed + self.global_batch : self.world_size]
            consumed += self.global_batch

    def __len__(self) -> int:
        return (self.dataset_len - self.consumed) // self.global_batch * self.batch_size

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "dataset_len": self.dataset_len,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved global position, whatever the world size is now."""
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        self._roll()
