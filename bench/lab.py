"""The lab's figures: seconds from a fault to the node blocked, to the job running again and
to the node back in service, for every fault kind, in one `gpuvigil lab` run (the faults
one after another on the same parts, as `make test` runs them).

"blocked" is printed as a ratio to its bound, what the configured intervals allow at worst
(the baseline, from the same run's settings): one agent check + one controller pass for a
GPU fault (the agent reads the kernel log as it grows, so it is often sooner), the stale
limit + one pass for agent-stop (the node is unknown only once its summary is stale). A
ratio above 1 is time spent on the machine, not in the platform's waits.

    PYTHONPATH=src python bench/lab.py                 # every fault
    PYTHONPATH=src python bench/lab.py xid48 xid79     # some (row-remap-failure last)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuvigil.lab.config import LabConfig
from gpuvigil.lab.faults import KINDS

SRC = Path(__file__).resolve().parents[1] / "src"


def run(faults: list[str]) -> list[dict] | str:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = [sys.executable, "-m", "gpuvigil", "lab", "--json", "--quiet"]
    for fault in faults:
        argv += ["--fault", fault]
    with tempfile.TemporaryDirectory(prefix="gpuvigil-bench-lab-") as tmp:
        r = subprocess.run([*argv, "--workdir", f"{tmp}/lab"], capture_output=True, text=True,
                           env=env, timeout=1800, check=False)  # fmt: skip
    if not r.stdout.strip():
        return r.stderr[-500:]
    out = json.loads(r.stdout)
    return out if isinstance(out, list) else [out]


def main() -> int:
    cfg = LabConfig()
    agent = cfg.agent["agent"]["fast_interval_s"]
    ctl = cfg.controller["interval_s"]
    stale = cfg.controller["policy"]["heartbeat_stale_s"]
    bound = {"agent-stop": stale + ctl}
    faults = sys.argv[1:] or ["rank-hang", "agent-stop", "xid48", "xid79", "row-remap-failure"]
    unknown = [f for f in faults if f not in KINDS]
    if unknown:
        print(f"unknown fault(s) {', '.join(unknown)}; one of {', '.join(KINDS)}")
        return 2
    load = os.getloadavg()[0]
    print(f"load average at start: {load:.1f}; bound for 'blocked' {agent + ctl:g} s (agent "
          f"check {agent:g} s + controller pass {ctl:g} s), {stale + ctl:g} s for agent-stop "
          f"(stale after {stale:g} s + a pass)")  # fmt: skip
    print(f"{'fault':<18} {'blocked':>8} {'x bound':>8} {'resumed':>8} {'in service':>11} "
          f"{'run':>6} {'steps':<22} settled")  # fmt: skip
    results = run(faults)
    if isinstance(results, str):
        print(f"the lab failed: {results}")
        return 1
    for r in results:
        fault, f = r["fault"], r["figures"]

        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        worst = bound.get(fault, agent + ctl)
        ratio = "-" if f["blocked_s"] is None else f"{f['blocked_s'] / worst:.2f}"
        print(f"{fault:<18} {s(f['blocked_s']):>8} {ratio:>8} {s(f['job_resumed_s']):>8} "
              f"{s(f['back_in_service_s']):>11} {r['duration_s']:>6.0f} "
              f"{','.join(r['remediation_steps']) or '-':<22} {r['settled']}")  # fmt: skip
    for fault in faults[len(results) :]:
        print(f"{fault:<18} not run (the fault before did not settle)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
