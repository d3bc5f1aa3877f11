"""The circuit breaker's cost per pass, and the fleet events in the simulator.

    PYTHONPATH=src python bench/breaker.py [--nodes 5000 20000] [--sim-nodes 512]

Part 1: one controller pass's breaker work (`Breaker.update` + `Gate.fleet_for` for every
node) over N synthetic nodes in 10 pools with seven attributes each, quiet and during a
bad-driver burst on 10% of the fleet; ratio against the quiet pass of the same size.
Part 2: CPU of each fleet-event scenario (`silence`, `pool-rollout`, the driver storm with
and without the breaker) against `full`, same fleet and seed, 30 days. CPU seconds, best of
three (part 1) or one run (part 2) in one process.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary, HealthSummary
from gpuvigil.platform.breaker import Breaker
from gpuvigil.platform.safety import Gate, SafetyConfig
from gpuvigil.platform.state import NodeView

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LOST = FindingSummary(code="GPU_LOST", component="gpu:3", status=Status.FAILED,
                      action=Action.REBOOT, fatal=True, check="gpu")  # fmt: skip


def fleet(n: int, bad: int) -> list[NodeView]:
    out = []
    for i in range(n):
        pool = i * 10 // n
        labels = {
            "gpuvigil.io/pool": f"p{pool}",
            "topology.kubernetes.io/zone": f"z{pool % 3}",
            "gpuvigil.io/rack": f"r{i // 4}",
            "node.kubernetes.io/instance-type": "p5",
        }
        driver = "560.35.03" if i < bad else "550.54.15"
        facts = {"driver-version": driver, "kernel-version": "5.15", "os-image": "u22"}
        found = [LOST] if i < bad else []
        health = HealthSummary(generated_at=NOW, status=Status.worst(f.status for f in found),
                               findings=found)  # fmt: skip
        out.append(NodeView(name=f"n{i}", labels=labels, attributes=facts, health=health,
                            health_error=None, heartbeat_at=NOW))  # fmt: skip
    return out


def one_pass(nodes: list[NodeView]) -> tuple[float, int]:
    best, trips = float("inf"), 0
    for _ in range(3):
        cfg = SafetyConfig()
        b = Breaker(cfg)
        t = time.process_time()
        trips = len(b.update(nodes, now=NOW))
        gate = Gate(cfg, nodes, now=NOW, breaker=b)
        for v in nodes:
            gate.fleet_for(v)
        best = min(best, time.process_time() - t)
    return best, trips


def sim(nodes: int) -> None:
    from gpuvigil.sim.run import simulate

    simulate("full", nodes=64, days=2, seed=1, events=False)  # warm the layer-1 verdicts
    base = None
    print(f"\n{nodes:,} nodes x 30 days, seed 1, events scored by observe")
    print(f"{'scenario':<26}{'CPU s':>8}{'x full':>8}  breaker trips, false drains, replaced")
    for name in ("full", "silence", "pool-rollout", "driver-storm+breaker",
                 "driver-storm-no-breaker"):  # fmt: skip
        t = time.process_time()
        r = simulate(name, nodes=nodes, days=30, seed=1)
        cpu = time.process_time() - t
        base = base or cpu
        print(f"{name:<26}{cpu:>8.2f}{cpu / base:>8.1f}  {r.breaker_trips}, {r.false_drains}, "
              f"{r.healthy_replaced}")  # fmt: skip


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="*", default=[5000, 20000])
    ap.add_argument("--sim-nodes", type=int, default=512)
    args = ap.parse_args(argv)
    print(f"{'nodes':>8}{'pass':>12}{'CPU s':>9}{'x quiet':>9}{'causes opened':>15}")
    for n in args.nodes:
        quiet, _ = one_pass(fleet(n, 0))
        storm, trips = one_pass(fleet(n, n // 10))
        print(f"{n:>8,}{'quiet':>12}{quiet:>9.3f}{1.0:>9.1f}{0:>15}")
        print(f"{n:>8,}{'10% burst':>12}{storm:>9.3f}{storm / quiet:>9.1f}{trips:>15}")
    if args.sim_nodes:
        sim(args.sim_nodes)


if __name__ == "__main__":
    main(sys.argv[1:])
