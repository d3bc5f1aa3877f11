"""Training-layer benchmarks; each prints a ratio against a baseline measured in the same run.

    PYTHONPATH=src python bench/training.py            # all of them (about 10 minutes)
    PYTHONPATH=src python bench/training.py e2e        # or: stall, verify, restart, overhead

e2e:      end to end: the same training run (25M-parameter model, AdamW, 40 steps, a save
          every 4) with no checkpoints, synchronous saves and async saves, alternated.
          Target: async faster than sync, near no checkpoints.
stall:    training stall per checkpoint of a ~100M-parameter model (AdamW: 1.2 GB of state),
          async vs synchronous save, one process on CPU. Target: async <= 20% of sync.
verify:   resume of a checkpoint saved by 4 ranks: the time 4 ranks take to verify it (each
          its own share, in parallel) against one process verifying all of it.
restart:  seconds from a worker's SIGKILL to the first completed step after the group's
          restart and resume, torchrun with 2 CPU ranks (examples/train_resilient.py).
overhead: per-step cost of everything the Run does between steps (watchdog, heartbeat,
          busy-time straggler detection with its DDP hook, drain agreement; checkpoints off)
          vs the bare loop, 2 ranks under the launcher. Target: < 1%.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_resilient.py"
FAULTY = ROOT / "tests" / "integration" / "training" / "faulty.py"
NO_GATE = {"GPUVIGIL__TRAINING__HEALTH_GATE__ON_MISSING": "allow"}


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, **NO_GATE, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- stall: async vs sync checkpoint, ~100M parameters --------------------------------------
def stall(measured: int = 2) -> None:
    _one_rank()
    import torch
    from torch import nn

    from gpuvigil import training

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(6)])
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 4096)
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    writes: dict[str, list[float]] = {"sync": [], "async": []}
    first: dict[str, float] = {}
    env = None
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        for mode in ("sync", "async"):
            cfg = training.TrainingConfig.load(
                overrides={
                    "checkpoint": {
                        "dir": f"{tmp}/{mode}",
                        "every_steps": 10**9,
                        "mode": mode,
                        "save_final": False,
                    },
                    "straggler": {"enabled": False},
                }
            )
            if env is None:
                env = training.init(cfg)
            env.config = cfg
            with training.Run(env, model=model, optimizer=opt) as run:
                for step in run.steps(measured + 1):
                    model(x).square().mean().backward()
                    opt.step()
                    opt.zero_grad()
                    run.step = step + 1
                    t0 = time.perf_counter()
                    run.save()  # what the loop does every N steps
                    t1 = time.perf_counter()
                    run._ckpt.wait()  # checkpoints are minutes apart: the write is done by then
                    if step == 0:  # the first save allocates the host buffers
                        first[mode] = t1 - t0
                    else:
                        stalls[mode].append(t1 - t0)
                        writes[mode].append(time.perf_counter() - t0)
    training.shutdown()
    s, a = statistics.median(stalls["sync"]), statistics.median(stalls["async"])
    print(
        f"stall: model {n_params / 1e6:.1f}M parameters, AdamW "
        f"({n_params * 12 / 1e9:.2f} GB of model+optimizer state), median of {measured} saves"
    )
    print(f"stall: sync  stall {s:.3f}s")
    print(
        f"stall: async stall {a:.3f}s (write+verify+commit in the background: "
        f"{statistics.median(writes['async']):.2f}s)"
    )
    print(
        f"stall: first save (allocates the host buffers): sync {first['sync']:.3f}s, "
        f"async {first['async']:.3f}s"
    )
    print(f"stall: RATIO async/sync = {a / s:.3f}  (target <= 0.20)")


def _one_rank() -> None:
    """This process as rank 0 of 1, without torchrun."""
    os.environ.update(
        NO_GATE,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
    )


# --- e2e: the whole run, no checkpoints vs sync vs async ------------------------------------
class _Saves(logging.Handler):
    """Collects (duration, stall) of each save from the checkpoint log lines."""

    PATTERN = re.compile(r"saved in ([\d.]+)s \((\w+), stall ([\d.]+)s\)")

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, list[tuple[float, float]]] = {"sync": [], "async": []}

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.search(record.getMessage())
        if m:
            self.seen[m.group(2)].append((float(m.group(1)), float(m.group(3))))


def e2e(repeats: int = 2, steps: int = 40, every: int = 4) -> None:
    """One training process with one intra-op thread, as a GPU job leaves the host's cores
    mostly idle: the async writer process gets the other core, as it would on a GPU node."""
    _one_rank()
    import torch
    from torch import nn

    from gpuvigil import training

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(6)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, 2048)
    n_params = sum(p.numel() for p in model.parameters())
    env = None
    walls: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
    saves = _Saves()
    ckpt_log = logging.getLogger("gpuvigil.training.checkpoint")
    ckpt_log.addHandler(saves)
    ckpt_log.setLevel(logging.INFO)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        for r in range(repeats + 1):  # round 0 warms caches and allocators, not counted
            for mode in ("none", "sync", "async"):
                ckpt = None if mode == "none" else f"{tmp}/{mode}-{r}"
                cfg = training.TrainingConfig.load(
                    overrides={
                        "checkpoint": {
                            "dir": ckpt,
                            "every_steps": every,
                            "mode": mode if ckpt else "async",
                        },
                        "straggler": {"enabled": False},
                    }
                )
                if env is None:
                    env = training.init(cfg)
                env.config = cfg
                t0 = time.perf_counter()
                with training.Run(env, model=model, optimizer=opt) as run:
                    for _ in run.steps(steps):
                        model(x).square().mean().backward()
                        opt.step()
                        opt.zero_grad()
                wall = time.perf_counter() - t0  # includes the last save's commit (close)
                if r:
                    walls[mode].append(wall)
                if ckpt:
                    shutil.rmtree(ckpt, ignore_errors=True)
    training.shutdown()
    med = {m: statistics.median(v) for m, v in walls.items()}
    gb = n_params * 12 / 1e9
    print(
        f"e2e: {n_params / 1e6:.1f}M parameters + AdamW ({gb:.2f} GB of state), {steps} steps, "
        f"a save every {every} ({steps // every} saves), 1 training thread, median of {repeats}"
    )
    for m in ("none", "sync", "async"):
        print(f"e2e: {m:5s} {med[m]:.2f}s  " + " ".join(f"{w:.2f}" for w in walls[m]))
    for mode in ("sync", "async"):
        got = saves.seen[mode]
        print(
            f"e2e: {mode:5s} per save (median of {len(got)}): training stalled "
            f"{statistics.median(s for _, s in got):.3f}s, save took "
            f"{statistics.median(d for d, _ in got):.2f}s"
        )
    print(
        f"e2e: RATIO async/sync = {med['async'] / med['sync']:.3f}; checkpoint cost over no "
        f"checkpoints: sync +{med['sync'] - med['none']:.2f}s, async "
        f"+{med['async'] - med['none']:.2f}s"
    )


# --- verify: resume verification, 4 ranks in parallel vs one process -----------------------
def verify() -> None:
    import torch

    from gpuvigil.training import manifest
    from gpuvigil.training.storage import LocalStorage

    _ = torch
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        base = [
            sys.executable,
            "-m",
            "gpuvigil.training.launch",
            "--standalone",
            "--nproc-per-node=4",
            __file__,
            "verify-worker",
            f"{tmp}/ckpt",
        ]
        env = _env({"OMP_NUM_THREADS": "1"})
        p = subprocess.run(
            [*base, "1"], check=False, env=env, capture_output=True, text=True, timeout=900
        )
        if p.returncode != 0:
            sys.exit(f"verify bench (save) failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        storage = LocalStorage(f"{tmp}/ckpt")
        ((_, folder),) = manifest.committed(storage)
        t0 = time.perf_counter()
        m, why = manifest.verify(storage, folder)
        serial = time.perf_counter() - t0
        assert m is not None, why
        total = sum(e["size"] for e in m.files.values())
        p = subprocess.run(
            [*base, "2"], check=False, env=env, capture_output=True, text=True, timeout=900
        )
        if p.returncode != 0:
            sys.exit(f"verify bench (resume) failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    lines = re.findall(
        r"rank (\d) verified (\d+) of \d+ files of \S+ \((\d+) bytes, [^)]*\) in ([\d.]+)s",
        p.stdout + p.stderr,
    )
    per_rank = {int(r): (int(b), float(s)) for r, _n, b, s in lines}
    parallel = max(s for _, s in per_rank.values())
    print(
        f"verify: checkpoint of {total / 1e6:.0f} MB saved by 4 ranks; one process verifies "
        f"all of it in {serial:.2f}s"
    )
    print(
        "verify: 4 ranks in parallel: "
        + ", ".join(
            f"rank {r} {b / 1e6:.0f} MB in {s:.2f}s" for r, (b, s) in sorted(per_rank.items())
        )
    )
    print(f"verify: RATIO parallel/serial = {parallel / serial:.3f}  (1/4 with 4 free cores)")


def verify_worker(ckpt: str, steps: int) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gpuvigil import training

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = training.TrainingConfig.load(
        overrides={"checkpoint": {"dir": ckpt, "every_steps": 1, "save_final": False}}
    )
    env = training.init(cfg)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(16)]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with training.Run(env, model=model, optimizer=opt) as run:
        for _ in run.steps(steps):
            model(torch.randn(4, 1024)).sum().backward()
            opt.step()
            opt.zero_grad()
    training.shutdown()


# --- restart: worker death -> first step after resume ---------------------------------------
_TS = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank(\d) (.*)$")


def restart(kills: int = 3) -> None:
    faults = ",".join(f"kill@1:{6 + 6 * i}:{i}" for i in range(kills))
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            f"--max-restarts={kills}",
            "--monitor-interval=0.1",
            str(FAULTY),
            str(EXAMPLE),
            "--steps",
            str(6 * kills + 6),
            "--checkpoint-every",
            "2",
            "--checkpoint-dir",
            f"{tmp}/ckpt",
        ]
        p = subprocess.run(
            argv,
            check=False,
            env=_env({"GV_FAULTS": faults, "OMP_NUM_THREADS": "1"}),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if p.returncode != 0:
            sys.exit(f"restart bench failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    deaths, firsts = [], []
    for line in (p.stdout + p.stderr).splitlines():
        m = _TS.match(line)
        if not m:
            continue
        ts = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if "faults: SIGKILL" in m.group(3):
            deaths.append(ts)
        elif "first step of this attempt done" in m.group(3) and m.group(2) == "0":
            firsts.append(ts)
    firsts.sort()
    lat = [min(f for f in firsts if f > d) - d for d in sorted(deaths)]
    med = statistics.median(lat)
    print(
        f"restart: {len(lat)} kills, death -> first step after resume: "
        + ", ".join(f"{x:.2f}s" for x in lat)
        + f"; median {med:.2f}s"
    )


# --- overhead: straggler detection + watchdog per step --------------------------------------
def overhead(blocks: int = 6, steps: int = 300) -> None:
    argv = [
        sys.executable,
        "-m",
        "gpuvigil.training.launch",  # so the heartbeat the monitor reads is written too
        "--standalone",
        "--nproc-per-node=2",
        __file__,
        "overhead-worker",
        str(blocks),
        str(steps),
    ]
    p = subprocess.run(
        argv,
        check=False,
        env=_env({"OMP_NUM_THREADS": "1"}),
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = [ln for ln in p.stdout.splitlines() if ln.startswith("overhead:")]
    if p.returncode != 0 or not out:
        sys.exit(f"overhead bench failed:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    print("\n".join(out))


def overhead_worker(blocks: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gpuvigil import training

    cfg = training.TrainingConfig.load(overrides={"straggler": {"every_steps": 20}})
    env = training.init(cfg)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    bare, managed = [], []
    for _ in range(2):
        step()
    for _ in range(blocks):  # alternate blocks so drifting machine load hits both alike
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        bare.append((time.perf_counter() - t0) / steps)
        dist.barrier()
        with training.Run(env, model=model, optimizer=opt) as run:
            t0 = time.perf_counter()
            for _ in run.steps(steps):
                step()
            managed.append((time.perf_counter() - t0) / steps)
    # The per-step bookkeeping alone, timed without the training step around it.
    with training.Run(env, model=model, optimizer=opt) as run:
        t0 = time.perf_counter()
        for _ in run.steps(steps * 4):
            pass
        book = (time.perf_counter() - t0) / (steps * 4)
    if env.rank == 0:
        b, m = statistics.median(bare), statistics.median(managed)
        print(
            f"overhead: bare step {b * 1e3:.3f} ms, in the Run {m * 1e3:.3f} ms "
            f"(medians of {blocks} blocks of {steps} steps)"
        )
        print(f"overhead: RATIO managed/bare = {m / b:.4f}  (target < 1.01)")
        print(
            f"overhead: bookkeeping alone {book * 1e6:.1f} us/step "
            f"(incl. a 2-rank all-gather every 20 steps) = {book / b * 100:.2f}% of a bare step"
        )
    training.shutdown()


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what == "overhead-worker":
        overhead_worker(int(sys.argv[2]), int(sys.argv[3]))
    elif what == "verify-worker":
        verify_worker(sys.argv[2], int(sys.argv[3]))
    else:
        benches = (
            ("e2e", e2e),
            ("stall", stall),
            ("verify", verify),
            ("restart", restart),
            ("overhead", overhead),
        )
        for name, fn in benches:
            if what in ("all", name):
                fn()
