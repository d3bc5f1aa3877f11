"""Simulator throughput at Llama 3 scale, and how it grows with the fleet.

Runs the `full` scenario (every layer, real rules/controller/observe, events recorded and
scored) of the default mixed workload for 54 days at 256 ... 16,384 nodes on one core, the
issue's target run (16,384 nodes x 90 days, goal < 30 s) and the `llama3` workload's
`baseline` (one 2,048-node job). Prints CPU time, engine events per second, time per
simulated node-day, each size's time as a ratio of the 256-node run measured in the same
process (the baseline), and the growth exponent against the previous size (1.0: linear).

    PYTHONPATH=src python bench/sim.py            # all sizes
    PYTHONPATH=src python bench/sim.py --quick    # 256 and 2,048 only
    PYTHONPATH=src python bench/sim.py --quick --target   # + 16,384 nodes x 90 days
"""

from __future__ import annotations

import math
import sys
import time

from gpuvigil.sim.run import simulate

DAYS = 54.0
SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)


def one(
    nodes: int, *, scenario: str = "full", workload: str = "mixed", days: float = DAYS
) -> tuple[float, int]:
    t0 = time.process_time()  # one core: CPU time of this process
    r = simulate(scenario, nodes=nodes, days=days, seed=1, workload=workload)
    return time.process_time() - t0, r.events + int(r.slo.get("events", 0))


def main() -> int:
    sizes = (256, 2048) if "--quick" in sys.argv else SIZES
    simulate("full", nodes=32, days=2)  # imports, verdict cache: not part of any figure
    print(f"{'nodes':>6} {'cpu s':>7} {'events':>8} {'events/s':>9} {'us/node-day':>12} "
          f"{'x 256':>6}")  # fmt: skip
    base = prev = None
    for n in sizes:
        runs = [one(n) for _ in range(3 if n <= 2048 else 1)]  # best of 3 where cheap
        cpu, events = min(runs)
        base = base or cpu
        per_node_day = cpu / (n * DAYS) * 1e6
        # growth exponent against the previous size: 1.0 is linear in the fleet
        k = math.log(cpu / prev[1]) / math.log(n / prev[0]) if prev else float("nan")
        prev = (n, cpu)
        print(f"{n:>6} {cpu:>7.2f} {events:>8} {events / cpu:>9.0f} {per_node_day:>12.1f} "
              f"{cpu / base:>6.2f}  n^{k:.2f}")  # fmt: skip
    if "--target" in sys.argv or "--quick" not in sys.argv:
        cpu, events = one(16384, days=90)
        print(
            f"target: full, 16,384 nodes x 90 days: {cpu:.2f} s CPU (goal < 30 s), "
            f"{events} events, x{cpu / base:.1f} the 256-node run"
        )
    cpu, events = one(2176, scenario="baseline", workload="llama3")
    print(
        f"llama3 baseline (2,176 nodes, one 2,048-node job, 54 days): {cpu:.2f} s CPU, "
        f"{events} events"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
