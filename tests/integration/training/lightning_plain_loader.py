"""examples/train_lightning.py with a plain DataLoader in place of its ResumableLoader, the
mistake users make: the callback (gpuvigil.training.lightning.Resilience) must refuse it
before the first step, and every rank exits 92 (NOT_RESUMABLE). Run by the tests only."""

import importlib.util
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

path = Path(__file__).resolve().parents[3] / "examples" / "train_lightning.py"
spec = importlib.util.spec_from_file_location("train_lightning", path)
assert spec is not None and spec.loader is not None
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
resumable = example.loader


def plain(**kwargs: Any) -> DataLoader:  # type: ignore[type-arg]
    """The example's data and batch size, in a DataLoader Lightning cannot resume mid-epoch."""
    return DataLoader(resumable(**kwargs).dataset, batch_size=16)


example.loader = plain
example.main()
