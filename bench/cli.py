"""Benchmark: what `gpuvigil` costs to start, against bare Python and typer, same run.

Each command runs in a fresh interpreter; the figure is its CPU time (user + system, from
`os.wait4`), the median of N runs, so a busy machine stretches the wall clock but not the
figure much. Baselines measured in the same run:

- `python -c pass` (the interpreter alone);
- `python -c "import typer"` (the command-line library every command needs).

Then `gpuvigil --help`, `--version`, a subcommand's `--help` (its module is imported only
then), and the import that `gpuvigil --help` used to pay before commands were loaded on
demand (`import gpuvigil.config`: the agent, controller and preflight settings).
Target: `gpuvigil --help` under 0.15 s of CPU.

    PYTHONPATH=src python bench/cli.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PY = sys.executable

CASES = (
    ("python -c pass", [PY, "-c", "pass"]),
    ("python -c 'import typer'", [PY, "-c", "import typer"]),
    ("gpuvigil --help", [PY, "-m", "gpuvigil", "--help"]),
    ("gpuvigil --version", [PY, "-m", "gpuvigil", "--version"]),
    ("gpuvigil logscan --help", [PY, "-m", "gpuvigil", "logscan", "--help"]),
    ("gpuvigil check --help", [PY, "-m", "gpuvigil", "check", "--help"]),
    ("import gpuvigil.config", [PY, "-c", "import gpuvigil.config"]),
)


def cpu_s(argv: list[str]) -> float:
    """CPU seconds (user + system) of one run of argv, children included."""
    env = dict(os.environ, PYTHONPATH=str(SRC), COLUMNS="80")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    got = {}
    for name, argv in CASES:
        cpu_s(argv)  # warm the page cache and the .pyc files
        got[name] = statistics.median(cpu_s(argv) for _ in range(args.runs))
    base, lib = got["python -c pass"], got["python -c 'import typer'"]
    print(f"{'command':<28} {'CPU s':>7} {'x python':>9} {'x typer':>8}")
    for name, s in got.items():
        print(f"{name:<28} {s:7.3f} {s / base:9.1f} {s / lib:8.2f}")
    verdict = "meets" if got["gpuvigil --help"] < 0.15 else "MISSES"
    print(f"gpuvigil --help: {got['gpuvigil --help']:.3f} s CPU, {verdict} the 0.15 s target")


if __name__ == "__main__":
    main()
