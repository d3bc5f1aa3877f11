#!/usr/bin/env python3
"""Benchmark of the active checks and preflight.

Prints, on the machine it runs on:
  1. achieved matmul TFLOP/s per device from gpuvigil's sustained-load check, as a ratio
     to the catalog's dense peak for that GPU model (node/catalog/gpu_performance.yaml);
  2. the same figure as a ratio to a bare torch.matmul loop measured in the same run
     (the baseline: what gpuvigil's harness costs);
  3. `gpuvigil preflight`'s total wall time against its budget, and per-check times.

    python bench/active.py --device cuda            # on a GPU machine
    python bench/active.py --device cpu --load-s 2  # anywhere
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuvigil.node.active.config import ActiveConfig  # noqa: E402
from gpuvigil.node.active.runner import run_active  # noqa: E402
from gpuvigil.node.catalog.gpu_performance import identify, load_models  # noqa: E402


def baseline_tflops(device: str, size: int, dtype_name: str, seconds: float) -> float:
    """A bare matmul loop on device 0: the most a harness could get."""
    import torch

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    a = torch.randn(size, size).to(dt).to(dev)
    b = torch.randn(size, size).to(dt).to(dev)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
        if device == "cuda" and n % 16 == 0:
            torch.cuda.synchronize()
    if device == "cuda":
        torch.cuda.synchronize()
    return 2.0 * size**3 * n / (time.perf_counter() - t0) / 1e12


def run_preflight(device: str, budget_s: float) -> dict:
    argv = [
        sys.executable,
        "-m",
        "gpuvigil",
        "preflight",
        "--device",
        device,
        "--json",
        "--budget-s",
        str(budget_s),
    ]
    if device == "cpu":
        argv += ["--expect-gpus", "0"]
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    import os

    env = {**os.environ, **env}
    t0 = time.perf_counter()
    p = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=budget_s + 60, check=False
    )
    wall = time.perf_counter() - t0
    try:
        out = json.loads(p.stdout)
    except ValueError:
        out = {"error": p.stderr[-2000:]}
    out["wall_s"] = wall
    out["exit_status"] = p.returncode
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--load-s", type=float, default=None, help="sustained-load seconds")
    ap.add_argument("--budget-s", type=float, default=120.0, help="preflight budget")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--skip-preflight", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (medians)")
    args = ap.parse_args()

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                f"no CUDA device for torch {torch.__version__}: nothing to measure "
                "(use --device cpu)",
                file=sys.stderr,
            )
            return 3
    cfg = ActiveConfig(checks=["load"], load_s=args.load_s)
    sizes = cfg.sizes(args.device)
    # Alternate the two measurements and keep medians: a shared machine's load drifts.
    bases, runs = [], []
    for _ in range(args.rounds):
        runs.append(run_active(cfg, device=args.device, budget_s=sizes.load_s + 120))
        bases.append(baseline_tflops(args.device, sizes.load_size, sizes.load_dtype, sizes.load_s))
    base = statistics.median(bases)
    outcome = runs[-1]
    by_device: dict[str, list[float]] = {}
    for run in runs:
        for m in run.measurements:
            by_device.setdefault(m.component, []).append(m.achieved or 0.0)
    models = load_models()
    rows = []
    for last in outcome.measurements:
        m = replace(last, achieved=statistics.median(by_device[last.component]))
        i = int(m.component.split(":")[1])
        name = outcome.devices[i] if i < len(outcome.devices) else "?"
        found = identify(name, models) if args.device == "cuda" else None
        peak = getattr(found[1].dense_tflops, sizes.load_dtype) if found else None
        rows.append(
            {
                "device": m.component,
                "name": name,
                "model": found[0] if found else None,
                "dtype": sizes.load_dtype,
                "size": sizes.load_size,
                "achieved_tflops": m.achieved,
                "peak_tflops": peak,
                "ratio_to_peak": m.achieved / peak if peak and m.achieved else None,
                "baseline_tflops": base,
                "ratio_to_baseline": m.achieved / base if base and m.achieved else None,
                "status": m.status,
                "code": m.code,
            }
        )
    problems = [f"{f.check} {f.code}: {f.message}" for f in outcome.findings]
    pf = None if args.skip_preflight else run_preflight(args.device, args.budget_s)
    figures = {
        "device": args.device,
        "load_s": sizes.load_s,
        "rounds": args.rounds,
        "baseline_rounds_tflops": bases,
        "matmul": rows,
        "problems": problems,
    }
    if pf is not None:
        figures["preflight"] = {
            k: pf.get(k)
            for k in (
                "result",
                "exit_status",
                "duration_s",
                "wall_s",
                "budget_s",
                "check_durations_s",
                "devices",
                "error",
            )
        }
    if args.json:
        print(json.dumps(figures, indent=2, default=str))
        return 0
    print(
        f"active-check benchmark on {args.device} ({sizes.load_dtype}, "
        f"{sizes.load_size}x{sizes.load_size}, {sizes.load_s:g} s sustained, medians of "
        f"{args.rounds} alternating rounds)"
    )
    for r in rows:
        ratio = f"{r['ratio_to_peak']:.2f}" if r["ratio_to_peak"] is not None else "n/a"
        print(
            f"  {r['device']:7} {r['name'][:28]:28} achieved {r['achieved_tflops']:.4g} "
            f"TFLOP/s  peak {r['peak_tflops'] or 'n/a'}  ratio to peak {ratio}  "
            f"ratio to bare loop {r['ratio_to_baseline'] or 0:.2f}  {r['status']}"
        )
    print(
        f"  bare torch.matmul loop on device 0: {base:.4g} TFLOP/s (median of "
        f"{', '.join(f'{b:.3g}' for b in bases)})"
    )
    for p in problems:
        print(f"  problem: {p}")
    if pf is not None:
        print(
            f"preflight: {pf.get('result')} (exit {pf['exit_status']}) in "
            f"{pf.get('duration_s')} s of a {pf.get('budget_s')} s budget "
            f"(process wall {pf['wall_s']:.1f} s); per check: {pf.get('check_durations_s')}"
        )
        if pf.get("error"):
            print(f"preflight error: {pf['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
