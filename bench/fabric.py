#!/usr/bin/env python3
"""CPU cost of the fabric and PCIe checks on a fake p5.48xlarge node (8 GPUs, 32 EFA).

Baseline, measured in the same run: reading the same sysfs files with a bare loop
(open + read of every file the checks read). Prints CPU ms per check run and the ratio.

    python bench/fabric.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuvigil.fakes.sysfs import FakeSysfs  # noqa: E402
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check  # noqa: E402
from gpuvigil.node.config import NodeConfig  # noqa: E402
from gpuvigil.node.sweep import load_checks  # noqa: E402

RUNS = 200


def bare_read(root: Path) -> int:
    n = 0
    for base in (root / "sys/class/infiniband", root / "sys/bus/pci/devices"):
        for dirpath, _dirs, files in os.walk(base, followlinks=True):
            if dirpath.count(os.sep) - str(base).count(os.sep) > 4:
                continue
            for f in files:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    fh.read(4096)
                n += 1
    return n


def cpu_ms(fn, runs: int = RUNS) -> float:
    t0 = time.process_time()
    for _ in range(runs):
        fn()
    return (time.process_time() - t0) / runs * 1000


def main() -> int:
    load_checks()
    with tempfile.TemporaryDirectory() as d:
        fs = FakeSysfs.node(Path(d), gpus=8, kind="efa", adapters=32, product_name="p5.48xlarge")
        ctx = CheckContext(config=NodeConfig(), root=fs.root, env={"PATH": "/nonexistent"})
        files = bare_read(fs.root)
        base = cpu_ms(lambda: bare_read(fs.root))
        fabric = cpu_ms(lambda: run_check(REGISTRY["fabric"], ctx))
        pcie = cpu_ms(lambda: run_check(REGISTRY["pcie"], ctx))
    print(f"fake p5.48xlarge: 8 GPUs, 32 EFA ({files} sysfs files), {RUNS} runs each")
    print(f"  bare read of the same files: {base:.2f} ms CPU")
    print(f"  fabric check: {fabric:.2f} ms CPU  ({fabric / base:.2f}x the bare read)")
    print(f"  pcie check:   {pcie:.2f} ms CPU  ({pcie / base:.2f}x the bare read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
