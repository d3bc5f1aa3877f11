"""Benchmark: `gpuvigil report` over a large event log, against `wc -l` of the same file.

Generates N synthetic events (default 10 million) in a temporary folder, then measures in
the same run, each as a child process (wall time and peak RSS from wait4):
  - the baseline: `wc -l FILE` (the cost of reading the bytes at all);
  - `gpuvigil report FILE --window all --json` (parse, SLOs, attribution);
  - the same report over the first half of the file, to show that memory is bounded
    (peak RSS must not grow with the number of events once the fleet-sized tables — one
    entry per node and GPU, 10k-sample reservoirs — have filled).
Prints the figures and the ratios. Usage:
    PYTHONPATH=src python bench/report.py [--events 10000000] [--nodes 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuvigil.observe import synthetic  # noqa: E402

TIME = Path("/usr/bin/time")  # GNU time: the child's own peak RSS, not the forked parent's


def measure(argv: list[str], *, workdir: Path) -> tuple[float, float, float]:
    """Run argv; return (wall s, CPU s, peak RSS MiB) of that command alone.

    CPU time (user + system) is the figure to compare on a shared machine: wall time also
    counts the time other processes held the cores. Peak RSS comes from GNU time when it
    is installed: rusage of a child forked from this interpreter would start at this
    interpreter's size."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = workdir / "time.out"
    timed = [str(TIME), "-f", "%M %U %S", "-o", str(out), *argv] if TIME.exists() else argv
    t0 = time.perf_counter()
    proc = subprocess.Popen(timed, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    if TIME.exists():
        kb, user, sys_s = out.read_text().split()[-3:]
        return wall, float(user) + float(sys_s), int(kb) / 1024
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--file", type=Path, help="use this event log instead of generating one")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuvigil-bench-report-"))
    try:
        log = tmp / "events.jsonl"
        t0 = time.perf_counter()
        if args.file:
            log = args.file
            with log.open("rb") as f:
                n = sum(1 for _ in f)
        else:
            n = synthetic.write(log, nodes=args.nodes, events=args.events)
        gen_s = time.perf_counter() - t0
        size_mb = log.stat().st_size / 2**20
        half = tmp / "half.jsonl"
        with log.open("rb") as src, half.open("wb") as dst:
            for i, line in enumerate(src):
                if i >= n // 2:
                    break
                dst.write(line)
        report = [sys.executable, "-m", "gpuvigil", "report", "--window", "all", "--json"]
        wc_s, wc_cpu, wc_mb = measure(["wc", "-l", str(log)], workdir=tmp)
        rep_s, rep_cpu, rep_mb = measure([*report, str(log)], workdir=tmp)
        small_s, small_cpu, small_mb = measure([*report, str(half)], workdir=tmp)
        wc2_s, wc2_cpu, _ = measure(
            ["wc", "-l", str(log)], workdir=tmp
        )  # again, cache warmed by the report
        base, base_cpu = min(wc_s, wc2_s), max(min(wc_cpu, wc2_cpu), 1e-3)
        print(f"events: {n:,} ({size_mb:,.0f} MiB, {args.nodes} nodes); generated in {gen_s:.0f} s")
        print(f"wc -l:           wall {base:8.2f} s  cpu {base_cpu:8.2f} s  peak {wc_mb:7.1f} MiB")
        print(f"gpuvigil report: wall {rep_s:8.2f} s  cpu {rep_cpu:8.2f} s  peak {rep_mb:7.1f} MiB"
              f"  ({n / rep_cpu:,.0f} events per CPU-second)")  # fmt: skip
        print(
            f"report, 1/2:     wall {small_s:8.2f} s  cpu {small_cpu:8.2f} s  "
            f"peak {small_mb:7.1f} MiB"
        )
        print(
            f"ratio time   report / wc -l: wall {rep_s / base:,.0f}x, "
            f"cpu {rep_cpu / base_cpu:,.0f}x"
        )
        print(f"ratio memory report / wc -l: {rep_mb / wc_mb:,.1f}x")
        print(f"memory growth 2x events:     {rep_mb / small_mb:.2f}x (1.0 = bounded)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
