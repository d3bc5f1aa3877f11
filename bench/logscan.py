"""Benchmark: `gpuvigil logscan` throughput against `grep -c Xid` on the same file, same run.

Writes a 200 MB kernel log (dmesg raw format; 1% of the lines are Xid/SXid events by
default, an Xid storm, `--event-pct` sets the share; the rest realistic kernel noise, a few
lines that mention "Xid" without being events) into a temporary folder, then times, best
of N warm runs each:

- `grep -c Xid FILE` (the baseline: GNU grep, fixed string, page cache warm);
- the parser in-process (`kernel_log_parser.iter_stream`, what logscan/analyze call);
- the whole command `gpuvigil logscan --json FILE > /dev/null` (Python start-up included).

and prints the ratios grep_time / our_time (1.0 = as fast as grep; target >= 0.5 for the
whole command), in wall time and in CPU time (user + system of the process, best of N):
on a shared machine the CPU ratio is the steadier one.

Both densities (1% and 0.01%) in one run by default; ripgrep (`rg -c Xid`) beside grep
when it is installed (`make bench` installs it; the run says when it is absent);
`gpuvigil analyze --json --kind kernel-log` on the same log, with its ratio to logscan;
then `analyze` once on a 2 GiB log (the first density's log concatenated until it is
2 GiB, as rotated logs are: the target is an answer within 30 s; `--gib 0` skips it).

    make bench    # or: PYTHONPATH=src python bench/logscan.py [--mb 200] [--runs 3]
                  #     [--event-pct 1 0.01] [--gib 2]
"""

from __future__ import annotations

import argparse
import compileall
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from gpuvigil.node.checks.kernel_log.kernel_log_parser import iter_stream  # noqa: E402
from gpuvigil.node.checks.kernel_log.log_lines import LineStats  # noqa: E402

MENTION = "NVRM: GPU{e} Reset required, caused by previous Xid 79"  # says Xid, not an event
NOISE = [
    "pci 0000:{b:02x}:00.0: [10de:2330] type 00 class 0x030200 PCIe Endpoint",
    "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping",
    "EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode. Quota mode: none.",
    "mlx5_core 0000:{b:02x}:00.0: mlx5_pcie_event:301:(pid {p}): PCIe slot advertised power",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth{e}: link becomes ready",
    'audit: type=1400 audit({p}.123:{e}): apparmor="STATUS" operation="profile_load"',
    "NVRM: GPU at PCI:0000:{b:02x}:00: GPU-5a0c1f2e-9b3d-4c1e-8f7a-{p:012d}",
    "nvidia-fabricmanager: fabric state changed to configured on node {e}",
    "systemd-journald[{p}]: Data hash table of /var/log/journal/system.journal has a fill level",
]
EVENTS = [
    "NVRM: Xid (PCI:0000:{b:02x}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off "
    "the bus.",
    "NVRM: Xid (PCI:0000:{b:02x}:00): 13, pid={p}, name=python3, Graphics SM Warp Exception on "
    "(GPC {e}, TPC 1, SM 0): Out Of Range Address",
    "NVRM: Xid (PCI:0000:{b:02x}:00): 94, pid={p}, name=pt_main_thread, Ch 0000000{e}",
    "nvidia-nvswitch{e}: SXid (PCI:0000:{b:02x}:00.0): 20034, Fatal, Link {e} LTSSM Fault Up",
]


def write_log(path: Path, size_mb: int, *, seed: int = 7, event_pct: float = 1.0) -> int:
    """A kernel log of about `size_mb` MB, `event_pct` % of its lines Xid/SXid events;
    returns the number of event lines."""
    every = max(1, round(100 / event_pct))
    rng = random.Random(seed)
    block_lines, events = [], 0
    t = 100.0
    for i in range(40_000):  # ~4.5 MB of distinct lines, repeated with new stamps
        t += rng.random() / 10
        fill = {"b": rng.randrange(256), "p": rng.randrange(10**6), "e": rng.randrange(8)}
        if i % every == 0:
            text, events = rng.choice(EVENTS).format(**fill), events + 1
        elif i % 1000 == 50:
            text = MENTION.format(**fill)  # 0.1% of lines: grep counts them, we skip them
        else:
            text = rng.choice(NOISE).format(**fill)
        block_lines.append(f"{text}\n")
    target = size_mb * 1024 * 1024
    written, total_events, rep = 0, 0, 0
    with path.open("w") as f:
        while written < target:
            chunk = "".join(
                f"[{t + rep * 5000 + j * 0.1:14.6f}] {line}" for j, line in enumerate(block_lines)
            )
            f.write(chunk)
            written += len(chunk)
            total_events += events
            rep += 1
    return total_events


def _cpu() -> float:
    """CPU seconds of this process and of its finished children."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn, runs: int) -> tuple[float, float, object]:
    """(best wall time, best CPU time, the value) over `runs` runs."""
    walls, cpus, value = [], [], None
    for _ in range(runs):
        t0, c0 = time.perf_counter(), _cpu()
        value = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    return min(walls), min(cpus), value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--event-pct",
        type=float,
        nargs="+",
        default=[1.0, 0.01],
        help="share of lines that are Xid/SXid events, in %% (1: an Xid storm; 0.01: a node "
        "with a few bad days); each is its own log, all in one run (default: both)",
    )
    ap.add_argument("--gib", type=float, default=2.0, help="size of the big analyze log")
    args = ap.parse_args()
    grep = shutil.which("grep")
    if grep is None:
        sys.exit("grep not found")
    rg = shutil.which("rg")  # ripgrep, reported when installed
    if rg is None:
        print("ripgrep (rg) is not installed: no ripgrep figures (`make bench` installs it)")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    # An installed gpuvigil has its .pyc files (pip and Debian write them). From the source
    # tree with PYTHONDONTWRITEBYTECODE=1 (CI, our dev shells) every run would compile
    # every module again: 0.15 s of analyze's start-up that no user pays.
    compileall.compile_dir(SRC / "gpuvigil", quiet=1)
    print("gpuvigil's modules compiled to .pyc first, as an installed package has them")
    with tempfile.TemporaryDirectory(prefix="gpuvigil-bench-") as tmp:
        for i, pct in enumerate(args.event_pct):
            log = Path(tmp) / f"kern-{i}.log"
            one(log, mb=args.mb, runs=args.runs, pct=pct, grep=grep, rg=rg)
        if args.gib > 0:
            big(Path(tmp) / "kern-0.log", Path(tmp) / "big.log", gib=args.gib)
    print("targets: the whole logscan command >= 0.5x of grep; analyze within 1.5x of "
          "logscan; analyze on 2 GiB within 30 s")  # fmt: skip


def big(src: Path, log: Path, *, gib: float) -> None:
    """`analyze` once on a log of `gib` GiB: `src` concatenated (rotated logs, cat'ed)."""
    target = int(gib * 1024**3)
    with log.open("wb") as out, src.open("rb") as f:
        while out.tell() < target:
            f.seek(0)
            shutil.copyfileobj(f, out, length=8 << 20)
        out.truncate(target)  # may cut the last line: a partial line, as a live log has
    env = dict(os.environ, PYTHONPATH=str(SRC))
    argv = [sys.executable, "-m", "gpuvigil", "analyze", "--json", "--kind", "kernel-log",
            str(log)]  # fmt: skip
    t0, c0 = time.perf_counter(), _cpu()
    with open(os.devnull, "wb") as null:
        done = subprocess.run(argv, stdout=null, env=env, check=False)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    print(
        f"--- analyze on {log.stat().st_size / 1024**3:.1f} GiB: wall {wall:.1f} s, CPU "
        f"{cpu:.1f} s, exit {done.returncode} (target: an answer within 30 s)"
    )
    log.unlink()


def one(log: Path, *, mb: int, runs: int, pct: float, grep: str, rg: str | None) -> None:
    t0 = time.perf_counter()
    n_events = write_log(log, mb, event_pct=pct)
    size = log.stat().st_size
    print(
        f"--- {pct}% events: wrote {size / 1e6:.0f} MB, {n_events} event lines in "
        f"{time.perf_counter() - t0:.1f} s"
    )

    def run_grep(tool: str = grep) -> int:
        out = subprocess.run([tool, "-c", "Xid", str(log)], capture_output=True, check=False)
        return int(out.stdout or 0)

    def run_parser() -> int:
        with log.open("rb") as f:  # as logscan calls it: no line count
            return sum(1 for _ in iter_stream(f, stats=LineStats(count_lines=False)))

    env = dict(os.environ, PYTHONPATH=str(SRC))

    def command(*argv: str) -> Callable[[], int]:
        def run() -> int:
            with open(os.devnull, "wb") as null:
                done = subprocess.run(
                    [sys.executable, "-m", "gpuvigil", *argv, str(log)],
                    stdout=null,
                    env=env,
                    check=False,
                )
            if done.returncode not in (0, 1):  # 1: it found failures (Xid 79), as it should
                raise SystemExit(f"{argv[0]} exited {done.returncode}")
            return 0

        return run

    run_grep()  # warm the page cache
    t_grep, c_grep, grep_lines = best(run_grep, runs)
    t_parse, c_parse, parsed = best(run_parser, runs)
    t_cli, c_cli, _ = best(command("logscan", "--json"), runs)
    t_an, c_an, _ = best(command("analyze", "--json", "--kind", "kernel-log"), runs)
    assert parsed == n_events, (parsed, n_events)
    mbs = size / 1e6
    print(
        f"grep -c Xid:             wall {t_grep:7.3f} s ({mbs / t_grep:5.0f} MB/s)  CPU "
        f"{c_grep:6.3f} s ({grep_lines} lines contain 'Xid', {n_events} are events)"
    )
    rows = [("parser (in-process):    ", t_parse, c_parse),
            ("gpuvigil logscan --json:", t_cli, c_cli),
            ("gpuvigil analyze --json:", t_an, c_an)]  # fmt: skip
    t_rg = c_rg = None
    if rg is not None:
        t_rg, c_rg, _ = best(lambda: run_grep(rg), runs)
        rows.insert(0, ("rg -c Xid (ripgrep):    ", t_rg, c_rg))
    else:
        print("rg -c Xid (ripgrep):     not installed")
    for name, t, c in rows:
        vs_rg = "" if t_rg is None else f"; to rg: wall {t_rg / t:.2f}x, CPU {c_rg / c:.2f}x"
        print(
            f"{name} wall {t:7.3f} s ({mbs / t:5.0f} MB/s)  CPU {c:6.3f} s   ratio to grep: "
            f"wall {t_grep / t:.2f}x, CPU {c_grep / c:.2f}x{vs_rg}"
        )
    print(f"analyze / logscan: wall {t_an / t_cli:.2f}x, CPU {c_an / c_cli:.2f}x")


if __name__ == "__main__":
    main()
