"""A DataLoader that resumes mid-epoch exactly: Lightning saves and restores its position.

    sampler = ResumableSampler(len(data), rank=rank, world_size=world, batch_size=16)
    trainer.fit(model, ResumableLoader(data, sampler), ckpt_path="last")

Lightning keeps the state of a train loader that has `state_dict`/`load_state_dict` in its
checkpoint and loads it before the loader's first iteration; a plain DataLoader has neither,
so a resume in the middle of an epoch reads that epoch again from its start (Lightning only
warns) and the weights differ from an uninterrupted run.

The position saved is the batches *trained on*, not the batches fetched: a DataLoader's
workers (`prefetch_factor`) and Lightning's fetcher (when the length is unknown) draw indices
ahead of training, so the sampler's own iteration cannot say where training is. The
`lightning.Resilience` callback calls `advance()` at each train batch end, before any
checkpoint of that batch is written (Lightning runs ModelCheckpoint's hooks last).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset

from gpuvigil.training.sampler import ResumableSampler


class ResumableLoader(DataLoader):  # type: ignore[type-arg]
    def __init__(self, dataset: Dataset[Any], sampler: ResumableSampler, **kwargs: Any) -> None:
        if not isinstance(sampler, ResumableSampler):
            # Lightning rebuilds the loader with a DistributedSampler when it is left to
            raise TypeError(
                f"ResumableLoader needs a gpuvigil ResumableSampler, got {type(sampler).__name__}"
                " (with DDP, pass Trainer(use_distributed_sampler=False): the ResumableSampler"
                " already gives each rank its share)"
            )
        taken = {"batch_size", "shuffle", "batch_sampler", "drop_last"} & kwargs.keys()
        if taken:
            raise TypeError(f"ResumableLoader takes {sorted(taken)} from its sampler")
        super().__init__(dataset, batch_size=sampler.batch_size, sampler=sampler, **kwargs)
        self.resumable = sampler

    def __len__(self) -> int:
        """A whole epoch's batches, wherever the position is: Lightning counts the batches
        of the epoch it restored and ends the epoch at this length."""
        return self.resumable.dataset_len // self.resumable.global_batch

    @property
    def position(self) -> int:
        """Batches of the current epoch trained on (every rank's count is the same)."""
        return self.resumable.consumed // self.resumable.global_batch

    def advance(self) -> None:
        """One batch was trained on (called at its end, before its checkpoint)."""
        self.resumable.advance()

    def state_dict(self) -> dict[str, Any]:
        return {**self.resumable.state_dict(), "world_size": self.resumable.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resumable.load_state_dict(state)
