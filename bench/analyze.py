"""Benchmark: memory and speed of `gpuvigil analyze` on a large kernel log, against the same
command on a one-line log in the same run (the interpreter and its imports).

Writes a kernel log of --mb MB (dmesg raw format, realistic noise, one Xid per ~1,000
lines) and a one-line log, runs `gpuvigil analyze --json` on each as a child process, and
prints each child's peak resident memory (`wait4` rusage), the difference (what the log
itself cost), the ratio big/small, and the big run's MB/s. Streaming keeps the difference
near one read chunk (8 MiB) whatever --mb is.

    PYTHONPATH=src python bench/analyze.py [--mb 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
NOISE = (
    "[{t:>12.6f}] mlx5_core 0000:{b:02x}:00.0: mlx5_pcie_event:301:(pid {p}): PCIe slot power\n"
    "[{t:>12.6f}] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode.\n"
    "[{t:>12.6f}] IPv6: ADDRCONF(NETDEV_CHANGE): eth{e}: link becomes ready\n"
)
XID = (
    "[{t:>12.6f}] NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={p}, name=python3, Graphics Exception\n"
)


def write_log(path: Path, mb: int) -> None:
    target, t, i = mb * 1024 * 1024, 1.0, 0
    with path.open("w") as f:
        while f.tell() < target:
            block = []
            for _ in range(333):
                i += 1
                t += 0.001
                block.append(NOISE.format(t=t, b=i % 256, p=i, e=i % 8))
            block.append(XID.format(t=t, b=0x3B, p=i))
            f.write("".join(block))


def run(log: Path) -> tuple[float, float, int]:
    """(peak RSS MiB, seconds, exit status) of `gpuvigil analyze --json LOG`."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuvigil", "analyze", "--json", str(log)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - t0
    return usage.ru_maxrss / 1024, elapsed, os.waitstatus_to_exitcode(status)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuvigil-bench-") as tmp:
        small, big = Path(tmp) / "small.log", Path(tmp) / "big.log"
        small.write_text(XID.format(t=1.0, b=0x3B, p=1))
        write_log(big, args.mb)
        size_mb = big.stat().st_size / 1e6
        base_rss, base_s, base_rc = run(small)
        big_rss, big_s, big_rc = run(big)
    print(f"one-line log : peak RSS {base_rss:7.1f} MiB, {base_s:5.2f} s, exit {base_rc}")
    print(f"{size_mb:6.0f} MB log : peak RSS {big_rss:7.1f} MiB, {big_s:5.2f} s, exit {big_rc}")
    cost, ratio = big_rss - base_rss, big_rss / base_rss
    print(f"the log's own cost: {cost:.1f} MiB; ratio big/small {ratio:.2f}")
    print(f"throughput (start-up included): {size_mb / big_s:.0f} MB/s")


if __name__ == "__main__":
    main()
