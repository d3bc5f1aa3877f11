"""The Lightning callback's drain agreement: what it costs a training step.

    PYTHONPATH=src python bench/lightning_drain.py [BLOCKS [STEPS]]   # 2 CPU ranks, ~20 s

The callback's drain (`training.drain.Drain`, as in `training.Run`) adds one tiny all-reduce
on the monitor group every K optimizer steps (K: about `drain.check_s` of training), started
at a batch end and read at the next check, so it never waits. Two figures, both on 2 ranks:
- the check alone: `Drain.after_step` per call with K forced to 1 (a 2-rank gloo all-reduce
  every step, the worst case) and with K as the drain picks it, against the bare step;
- A/B: seconds per step of the same Lightning fit (the example's model, DDP, 2 ranks) with the
  callback's drain on and off, alternated (and which goes first too), so drifting load hits
  both alike.
Target: the drain under 1% of a step.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(blocks: int = 6, steps: int = 200) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", GPUVIGIL__TRAINING__HEALTH_GATE__ON_MISSING="allow")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "gpuvigil.training.launch", "--standalone"]
    argv += ["--nproc-per-node=2", __file__, "worker", str(blocks), str(steps)]
    p = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=1200)
    out = [ln for ln in p.stdout.splitlines() if ln.startswith("lightning-drain:")]
    if p.returncode != 0 or not out:
        sys.exit(f"lightning drain bench failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    print("\n".join(out))


def worker(blocks: int, steps: int) -> None:
    import importlib.util
    import logging
    import tempfile

    import torch
    import torch.distributed as dist
    from pytorch_lightning import Callback, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    from gpuvigil.training import drain
    from gpuvigil.training.config import DrainConfig, TrainingConfig
    from gpuvigil.training.lightning import Resilience

    logging.disable(logging.WARNING)

    spec = importlib.util.spec_from_file_location(
        "example", ROOT / "examples" / "train_lightning.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # its model, not a copy of it

    class Clock(Callback):  # type: ignore[misc]
        """Seconds per step over the fit's batches after the first few."""

        def __init__(self) -> None:
            self.t: list[float] = []

        def on_train_batch_end(self, *args: object) -> None:
            self.t.append(time.perf_counter())

        def per_step(self) -> float:
            t = self.t[10:]
            return (t[-1] - t[0]) / (len(t) - 1)

    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    data = TensorDataset(x, x @ torch.randn(32, 1))
    root = tempfile.mkdtemp(prefix="gv-bench-pl-")

    def fit(drain_on: bool) -> float:
        cfg = TrainingConfig.load(
            overrides={"drain": {"enabled": drain_on}, "watchdog": {"enabled": False}}
        )
        clock = Clock()
        trainer = Trainer(
            max_steps=steps,
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            # the drain's cost per step is measured here, not a resume: any loader will do
            callbacks=[Resilience(cfg, allow_inexact_resume=True), clock],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            default_root_dir=root,
        )
        trainer.fit(example.Regression(), DataLoader(data, batch_size=16, shuffle=True))
        return clock.per_step()

    on, off = [], []
    for i in range(blocks):  # which goes first alternates too: no order bias
        for drain_on in (i % 2 == 0, i % 2 == 1):
            (on if drain_on else off).append(fit(drain_on))

    # The check alone, on the group the callback uses, without a training step around it.
    group = dist.new_group(backend="gloo")
    calls = steps * 5
    check = {}
    for name, cfg in (("every step", DrainConfig(check_s=1e-9)), ("as picked", DrainConfig())):
        d = drain.Drain(cfg, world_size=dist.get_world_size(), group=group)
        dist.barrier()
        t0 = time.perf_counter()
        for step in range(1, calls + 1):
            d.after_step(step, statistics.median(off))
        check[name] = (time.perf_counter() - t0) / calls
        d.close()
    if dist.get_rank() == 0:
        a, b = statistics.median(off), statistics.median(on)
        print(
            f"lightning-drain: step {a * 1e3:.3f} ms with the drain off, {b * 1e3:.3f} ms on "
            f"(medians of {blocks} alternated fits of {steps} steps)"
        )
        print(f"lightning-drain: RATIO on/off = {b / a:.4f}  (target < 1.01)")
        for name, s in check.items():
            print(
                f"lightning-drain: the check alone, K {name}: {s * 1e6:.1f} us/step "
                f"= {s / a * 100:.2f}% of a step"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(*(int(a) for a in sys.argv[1:3]))
