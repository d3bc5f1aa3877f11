"""CPU time of one full sweep of the node checks on a fake 8-GPU, 4-adapter node.

Two figures, each against a baseline measured in the same run:

- warm (agent mode): `run_sweep` in-process, NVML worker kept warm between sweeps; CPU of
  this process plus the worker's (from /proc) plus any tool it ran, per sweep. Target
  < 50 ms. Baseline: the CPU of a bare `python -c pass` process.
- cold: a whole `gpuvigil check --json` process (interpreter start, imports, a fresh NVML
  worker, every check, JSON out), CPU of the process tree. Baseline: `python -c pass`.

The node: fake NVML (`gpuvigil.fakes.nvml`) with 8 H100s and 18 NVLinks each, a fake sysfs
tree with 8 GPUs and 4 InfiniBand adapters (`gpuvigil.fakes.sysfs`), a 2,000-line kernel
log file with a few Xids, no `dcgmi` (both DCGM checks report CHECK_DISABLED).

    PYTHONPATH=src python bench/sweep.py [--sweeps 50] [--cold 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuvigil.config import load
from gpuvigil.fakes import gpu
from gpuvigil.fakes.sysfs import FakeSysfs
from gpuvigil.node.checks import CheckContext
from gpuvigil.node.checks.gpu import nvml
from gpuvigil.node.sweep import run_sweep

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def build_node(tmp: Path) -> tuple[dict[str, str], Path]:
    scenario = tmp / "node.json"
    gpu.make_node(8).save(scenario)
    fs = FakeSysfs.node(tmp / "root", gpus=8, kind="ib", adapters=4)
    lines = [f"[{i / 10:12.6f}] usb 1-1: new high-speed USB device number {i}" for i in range(2000)]
    lines[500] = (
        "[   50.000000] NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python3, Graphics Exception"
    )
    fs.write("var/log/kern.log", "\n".join(lines) + "\n")
    bindir = tmp / "bin"
    bindir.mkdir()
    env = {
        **os.environ,
        gpu.SCENARIO_ENV: str(scenario),
        "GPUVIGIL__NODE__GPU__NVML_MODULE": "gpuvigil.fakes.nvml",
        "GPUVIGIL__NODE__KERNEL_LOG__FILE": "var/log/kern.log",
        "GPUVIGIL__NODE__EXPECT_GPUS": "8",
        "PATH": f"{bindir}:/usr/bin:/bin",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src")]),
    }
    return env, fs.root


def cpu_of_process(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    before, t0 = children_cpu_s(), time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, check=False)
    return children_cpu_s() - before, time.monotonic() - t0, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweeps", type=int, default=50)
    ap.add_argument("--cold", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env, root = build_node(Path(d))
        cfg = load(None, environ=env)
        ctx = CheckContext(config=cfg.node, root=root, env=env)
        first = run_sweep(ctx, node="bench")  # starts the worker, registers NVML events
        assert first.exit_code() == 0, [f.code for f in first.problems]
        client = nvml.client_for("gpuvigil.fakes.nvml", env)
        worker = client.pid
        assert worker is not None
        samples, walls = [], []
        for _ in range(args.sweeps):
            c0, w0, k0, t0 = self_cpu_s(), proc_cpu_s(worker), children_cpu_s(), time.monotonic()
            report = run_sweep(ctx, node="bench")
            wall = time.monotonic() - t0
            samples.append(self_cpu_s() - c0 + proc_cpu_s(worker) - w0 + children_cpu_s() - k0)
            walls.append(wall)
            assert report.exit_code() == 0
        assert client.pid == worker, "the worker was restarted during the warm sweeps"
        nvml.close_all()

        base = [cpu_of_process([sys.executable, "-c", "pass"], env) for _ in range(args.cold)]
        cold = [
            cpu_of_process(
                [sys.executable, "-m", "gpuvigil", "check", "--json", "--sysfs-root", str(root)],
                env,
            )
            for _ in range(args.cold)
        ]
        assert all(rc == 0 for _, _, rc in cold), [rc for _, _, rc in cold]

    warm_ms = statistics.median(samples) * 1000
    base_ms = statistics.median(c for c, _, _ in base) * 1000
    cold_ms = statistics.median(c for c, _, _ in cold) * 1000
    out = {
        "warm_sweep_cpu_ms_median": round(warm_ms, 1),
        "warm_sweep_cpu_ms_p90": round(sorted(samples)[int(0.9 * len(samples))] * 1000, 1),
        "warm_sweep_wall_ms_median": round(statistics.median(walls) * 1000, 1),
        "warm_target_ms": 50,
        "warm_vs_target": round(warm_ms / 50, 2),
        "baseline_python_c_pass_cpu_ms": round(base_ms, 1),
        "warm_vs_python_c_pass": round(warm_ms / base_ms, 2),
        "cold_check_cpu_ms_median": round(cold_ms, 1),
        "cold_check_wall_s_median": round(statistics.median(w for _, w, _ in cold), 2),
        "cold_vs_python_c_pass": round(cold_ms / base_ms, 1),
        "sweeps": args.sweeps,
        "cold_runs": args.cold,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
