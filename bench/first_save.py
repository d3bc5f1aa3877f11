"""The first async save's stall, with the staging arena made on the training thread (as
before) against made before training starts (`Checkpointer.prepare`), one process on CPU.

    PYTHONPATH=src python bench/first_save.py

For 10 MB, 200 MB and 1 GB of state: the stall of the first `Stager.stage` on a fresh
stager (arena created and its pages faulted in during the save: the baseline), and the
stall of the first stage after `prepare` (what a `Run` now does before its first step),
each the median of 3, alternated. Prints the ratio prepared / cold. Target: the first save
stalls like any later one (ratio well under 1).
"""

from __future__ import annotations

import statistics
import time

import torch

from gpuvigil.training.staging import Stager

SIZES = (("10 MB", 10 << 20), ("200 MB", 200 << 20), ("1 GB", 1 << 30))


def first_stage(nbytes: int, *, prepared: bool) -> tuple[float, float]:
    """(seconds the first stage stalled, seconds prepare took before training)."""
    state = {"w": torch.ones(nbytes // 4, dtype=torch.float32)}
    st = Stager()
    try:
        t0 = time.perf_counter()
        if prepared:
            st.prepare(state)
        t1 = time.perf_counter()
        st.stage(state)
        return time.perf_counter() - t1, t1 - t0
    finally:
        st.close()


def main() -> None:
    print(f"{'state':>8} {'cold first save':>16} {'prepared':>10} {'prepare':>9} {'ratio':>7}")
    for label, n in SIZES:
        cold, warm, prep = [], [], []
        for _ in range(3):
            cold.append(first_stage(n, prepared=False)[0])
            w, p = first_stage(n, prepared=True)
            warm.append(w)
            prep.append(p)
        c, w, p = statistics.median(cold), statistics.median(warm), statistics.median(prep)
        print(f"{label:>8} {c:>15.3f}s {w:>9.3f}s {p:>8.3f}s {w / c:>7.3f}")


if __name__ == "__main__":
    main()
