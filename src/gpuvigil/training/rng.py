"""Every random number generator a training step may draw from: captured, restored, reseeded.

Called by `run.Run`: saved per rank with each checkpoint (`state_codec` keeps it as JSON:
tuples, numpy arrays and byte tensors), restored on resume at the same world size so a
deterministic job continues bit-identically, and reseeded reproducibly after a resize (a
rank's stream cannot be mapped onto a different number of ranks).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def reseed(seed: int, *, step: int, rank: int) -> None:
    value = seed * 1_000_003 + step * 1009 + rank
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)
