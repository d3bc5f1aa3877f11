"""Benchmark of `gpuvigil agent` on a fake 8-GPU, 4-adapter node (fake NVML, fake sysfs).

Measures, with the agent running for real as a subprocess at its default 30 s interval:
- CPU over `--minutes` (default 10) as a fraction of one core, summed over the agent and
  its NVML worker process (target < 0.05%);
- resident memory of the agent and of its NVML worker (target < 80 MB for the agent);
- latency from an Xid line appended to the kernel log to the condition in the published
  report (target < 2 s), over several Xids;
- latency of a polled signal (an adapter port going down at a random moment of the
  interval) to the published report (target <= one interval).
Baseline, measured in the same run: an idle Python interpreter that imports the same
modules as the agent (its CPU and memory floor), so the ratios show the agent's own cost.

    PYTHONPATH=src python bench/agent.py --minutes 10

`--flood SECONDS` measures the kernel-log flood instead: the agent starts on an existing
`--backlog-mb` (127 MB) kernel log, then a writer appends `--rate` (98,000) Xid lines a
second for SECONDS; the agent's peak resident memory (VmHWM) against the 120 MB target,
the lines per second it was fed, and that it still published its report during the flood.

    PYTHONPATH=src python bench/agent.py --flood 60
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpuvigil.fakes.gpu import SCENARIO_ENV, make_node  # noqa: E402
from gpuvigil.fakes.sysfs import FakeSysfs  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
XID = (
    "[ {t:.6f}] NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)
BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (the NVML worker)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / TICK  # utime + stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def rss_mb(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def wait_for(pred, timeout: float, every: float = 0.01) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if pred():
                return time.monotonic() - t0
        except (OSError, ValueError):
            pass
        time.sleep(every)
    return None


def codes(state: Path) -> set[tuple[str, str]]:
    r = json.loads(state.read_text())
    return {(f["code"], f["component"]) for f in r["findings"]}


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the peak resident set of the process so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024 * 1.048576  # kB -> MB
    return 0.0


def write_backlog(path: Path, mb: float) -> None:
    block = "".join(
        f"[{i / 1000:14.6f}] usb 1-1: new high-speed USB device number {i} using xhci_hcd\n"
        for i in range(10_000)
    )
    with path.open("w") as fh:
        for _ in range(max(1, int(mb * 1e6 / len(block)))):
            fh.write(block)


def start_agent(
    work: Path, *, cfg: Path, kmsg: Path, state: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The agent under test (state file and HTTP sinks) and its baseline: a Python that
    imports the same modules and sleeps, so the ratio is the agent's work alone."""
    argv = [sys.executable, "-m", "gpuvigil", "agent", "--config", str(cfg),
            "--kmsg-file", str(kmsg), "--state-file", str(state), "--listen", "127.0.0.1:0",
            "--sink", "state-file", "--sink", "http", "--log-level", "warning"]  # fmt: skip
    base_code = (
        "import gpuvigil.node.compose, gpuvigil.node.sinks.http, "
        "gpuvigil.node.checks.gpu.nvml, time; time.sleep(1e6)"
    )
    log = open(work / "agent.log", "w")  # noqa: SIM115 - lives as long as the agent
    agent = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
    return agent, subprocess.Popen([sys.executable, "-c", base_code], env=env)


def stop(agent: subprocess.Popen[bytes], base: subprocess.Popen[bytes]) -> None:
    """The agent gets SIGTERM (a clean stop), SIGKILL after 15 s; the baseline SIGKILL."""
    agent.send_signal(signal.SIGTERM)
    base.kill()
    try:
        agent.wait(15)
    except subprocess.TimeoutExpired:
        agent.kill()
    base.wait(5)


def fake_node(work: Path, *, agent: dict[str, object]) -> tuple[FakeSysfs, Path, dict[str, str]]:
    """A fake 8-GPU, 4-adapter InfiniBand node in `work` (sysfs tree, NVML scenario) and
    an agent config for it (`agent` merged into its `agent:` section): (sysfs, config,
    the agent's environment)."""
    fs = FakeSysfs.node(work / "root", gpus=8, kind="ib", adapters=4, rate_gbps=400)
    scenario = work / "nvml.json"
    make_node(8).save(scenario)
    node = {
        "expect_gpus": 8,
        "gpu": {"nvml_module": "gpuvigil.fakes.nvml"},
        "fabric": {"expect_adapters": 4, "kind": "ib", "expect_rate_gbps": 400},
    }
    cfg = work / "agent.yaml"
    cfg.write_text(yaml.safe_dump({"node": node, "agent": {"sysfs_root": str(fs.root), **agent}}))
    return fs, cfg, {**os.environ, "PYTHONPATH": str(ROOT / "src"), SCENARIO_ENV: str(scenario)}


def flood(seconds: float, backlog_mb: float, lines_per_s: float) -> int:
    """The kernel-log flood: peak RSS of the agent while Xids are appended flat out."""
    work = Path(tempfile.mkdtemp(prefix="gpuvigil-bench-flood-"))
    _, cfg, env = fake_node(work, agent={"state_dir": str(work / "state")})
    kmsg = work / "kern.log"
    write_backlog(kmsg, backlog_mb)
    state = work / "report.json"
    agent, base = start_agent(work, cfg=cfg, kmsg=kmsg, state=state, env=env)
    lines = 0
    try:
        started = wait_for(state.exists, 120)
        if started is None:
            print("agent did not publish:", (work / "agent.log").read_text())
            return 1
        after_backlog = peak_rss_mb(agent.pid)
        published0 = state.stat().st_mtime
        line = (
            "[ {t:.6f}] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics "
            "SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address\n"
        )
        chunk = "".join(line.format(t=2000.0 + i / 1e6) for i in range(1000))
        t0 = time.monotonic()
        with kmsg.open("a") as fh:
            while time.monotonic() - t0 < seconds:
                fh.write(chunk)
                fh.flush()
                lines += 1000
                ahead = lines / lines_per_s - (time.monotonic() - t0)
                if ahead > 0:  # at the rate asked for (a writer that fills the disk is
                    time.sleep(ahead)  # not a kernel, and not what the agent must survive)
        rate = lines / (time.monotonic() - t0)
        time.sleep(5)  # let it catch up with the end of the flood
        peak = peak_rss_mb(agent.pid)
        rss_now = rss_mb(agent.pid)
        published = state.stat().st_mtime > published0
        alive = agent.poll() is None
        rss_base = rss_mb(base.pid)
    finally:
        stop(agent, base)
        size = kmsg.stat().st_size / 1e6
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"kernel-log flood: {backlog_mb:.0f} MB backlog, then {lines:,} Xid lines appended "
        f"in {seconds:g} s ({rate:,.0f} lines/s; file {size:.0f} MB at the end)"
    )
    print(
        f"agent peak resident memory (VmHWM): {peak:.1f} MB (target < 120 MB: "
        f"{peak / 120:.2f}x); after the backlog {after_backlog:.1f} MB, at the end "
        f"{rss_now:.1f} MB; idle-Python baseline with the same imports {rss_base:.1f} MB"
    )
    print(f"still alive: {alive}; published during the flood: {published}")
    return 0 if alive and published else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="CPU window (default 10)")
    ap.add_argument("--interval", type=float, default=30.0, help="fast interval (default 30)")
    ap.add_argument("--xids", type=int, default=5, help="Xid latency samples")
    ap.add_argument("--polls", type=int, default=3, help="port-down latency samples")
    ap.add_argument(
        "--flood",
        type=float,
        default=0.0,
        help="instead: flood the kernel log for this many seconds",
    )
    ap.add_argument(
        "--backlog-mb",
        type=float,
        default=127.0,
        help="the kernel log the flood starts on (default 127 MB)",
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=98_000,
        help="Xid lines per second in the flood (default 98,000)",
    )
    args = ap.parse_args()
    if args.flood:
        return flood(args.flood, args.backlog_mb, args.rate)
    # SIGTERM/SIGINT still stop the agent it started (the `finally` below runs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    work = Path(tempfile.mkdtemp(prefix="gpuvigil-bench-agent-"))
    fs, cfg, env = fake_node(work, agent={"fast_interval_s": args.interval})
    env["NODE_NAME"] = "bench-node"
    kmsg = work / "kern.log"
    kmsg.write_text("[    0.000000] Linux version 6.1.0\n")
    state = work / "report.json"
    agent, base = start_agent(work, cfg=cfg, kmsg=kmsg, state=state, env=env)
    try:
        if wait_for(state.exists, 60) is None:
            print("agent did not publish:", (work / "agent.log").read_text())
            return 1
        time.sleep(min(args.interval, 10))  # warm: the NVML worker has started
        pids = tree(agent.pid)
        c0, b0, t0 = cpu_s(pids), cpu_s([base.pid]), time.monotonic()
        a0 = cpu_s([agent.pid])
        time.sleep(args.minutes * 60)
        pids = tree(agent.pid)
        wall = time.monotonic() - t0
        cpu = (cpu_s(pids) - c0) / wall
        cpu_agent = (cpu_s([agent.pid]) - a0) / wall
        base_cpu = (cpu_s([base.pid]) - b0) / wall
        rss_agent = rss_mb(agent.pid)
        rss_workers = sum(rss_mb(p) for p in pids if p != agent.pid)
        rss_base = rss_mb(base.pid)

        xid_lat = []
        for i in range(args.xids):
            time.sleep(random.uniform(0.2, 1.0))
            line = XID.format(t=1000.0 + i, bus=BUSES[i % 8])
            start = time.monotonic()
            with kmsg.open("a") as fh:
                fh.write(line + "\n")
            lat = wait_for(lambda i=i: ("XID_79", f"gpu:{i % 8}") in codes(state), 30)
            xid_lat.append(lat if lat is not None else float("inf"))
            del start
        poll_lat = []
        for i in range(args.polls):
            time.sleep(random.uniform(0, args.interval))
            fs.port_down(f"mlx5_{i}")
            lat = wait_for(
                lambda i=i: (
                    ("FABRIC_PORT_DOWN", f"mlx5_{i}") in codes(state)
                    or any(
                        c == "FABRIC_PORT_DOWN" and f"mlx5_{i}" in comp for c, comp in codes(state)
                    )
                ),
                3 * args.interval,
            )
            poll_lat.append(lat if lat is not None else float("inf"))
    finally:
        stop(agent, base)
        shutil.rmtree(work, ignore_errors=True)

    core = 100 * cpu
    print(
        f"agent CPU over {wall / 60:.1f} min at a {args.interval:g} s interval "
        f"(agent + NVML worker): {core:.4f}% of one core (target < 0.05%: "
        f"{core / 0.05:.2f}x of target); the agent alone {100 * cpu_agent:.4f}%, the NVML "
        f"worker (fake NVML: its calls are Python, a driver's are C) "
        f"{core - 100 * cpu_agent:.4f}%; idle-Python baseline {100 * base_cpu:.4f}%"
    )
    print(
        f"resident memory: agent {rss_agent:.1f} MB (target < 80 MB: "
        f"{rss_agent / 80:.2f}x), NVML worker {rss_workers:.1f} MB; idle-Python baseline "
        f"with the same imports {rss_base:.1f} MB (agent/baseline {rss_agent / rss_base:.2f}x)"
    )
    xs = sorted(xid_lat)
    print(
        f"Xid line -> published report: median {xs[len(xs) // 2]:.3f} s, max {xs[-1]:.3f} s "
        f"over {len(xs)} Xids (target < 2 s: max {xs[-1] / 2:.2f}x of target)"
    )
    ps = sorted(poll_lat)
    print(
        f"adapter port down (polled) -> published report: median {ps[len(ps) // 2]:.1f} s, "
        f"max {ps[-1]:.1f} s over {len(ps)} (target <= {args.interval:g} s: max "
        f"{ps[-1] / args.interval:.2f}x of target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
