"""Two controllers, one with its clock 20 s ahead, on real Slurm 22.05 with leader election
over lease files (`clusters.slurm_lease`): they never both act and never exceed the
disruption budget, through a paused leader, its resumption and a killed leader.

Slurm keeps no audit log, so every Slurm command the controllers run goes through a
wrapper (their `bin_dir`) that, before running it, appends to one log the writer, the
newest lease version and the holder it names. Appends land in the order they happened:
the log is the timeline. Every write must come from the holder of the moment, and
replaying the records written (`Comment=`) never puts more nodes in the budget than it
allows. The same on a real kube-apiserver: test_split_brain.py."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import FATAL, health, wait_for
from split_brain import max_in_budget, run_disruptions, start

from gpuvigil.platform.clusters.slurm_lease import FileLease
from gpuvigil.platform.state import State, decode_record

pytestmark = pytest.mark.realparts

BUDGET = 1
SEP = "\x1f"
WRAPPER = """#!/bin/sh
# Test wrapper: log each write with the lease holder the lease files name right now.
case "{tool} $1" in
  "scontrol update"|"scontrol reboot"|"scontrol requeue"|scancel\\ *)
    latest=$(ls "{lease}" 2>/dev/null | grep '^lease\\.' | sort | tail -n 1)
    holder=$(sed -n 's/.*"holderIdentity": *"\\([^"]*\\)".*/\\1/p' "{lease}/$latest" 2>/dev/null)
    IFS="$(printf '\\037')"
    printf '%s\\t%s\\t%s\\t%s\\n' "$GV_ID" "$latest" "$holder" "$*" >> "{log}"
    ;;
esac
exec {real} "$@"
"""


def wrappers(folder: Path, *, lease: Path, log: Path) -> None:
    folder.mkdir()
    for tool in ("scontrol", "sinfo", "squeue", "scancel"):
        real = shutil.which(tool)
        assert real, tool
        path = folder / tool
        path.write_text(WRAPPER.format(tool=tool, lease=lease, log=log, real=real))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def config(tmp_path: Path, slurm: Any, *, bin_dir: Path, lease: Path) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(
        f"""controller:
  cluster: slurm
  interval_s: 0.5
  metrics_port: 0
  leader_election: true
  lease: {{duration_s: 6, renew_deadline_s: 4, retry_s: 0.5}}
  policy: {{reset_timeout_s: 10, reboot_timeout_s: 10, replace_timeout_s: 10, fatal_grace_s: 0}}
  safety:
    max_disrupted: {BUDGET}
    max_disrupted_percent: 100
    breaker_min_nodes: 1000000000  # the breaker stays out: every node is faulty on purpose
    breaker_stale_min_nodes: 1000000000
  slurm:
    conf: '{slurm.conf}'
    bin_dir: '{bin_dir}'
    lease_dir: '{lease}'
    timeout_s: 20
"""
    )
    return path


def publish(slurm: Any, node: str, *findings: Any) -> None:
    slurm.run("scontrol", "update", f"NodeName={node}", f"Extra={health(*findings)}")


def test_two_controllers_20s_apart_on_slurm(slurm, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lease, log, bins = tmp_path / "lease", tmp_path / "writes.log", tmp_path / "bin"
    wrappers(bins, lease=lease, log=log)
    for n in slurm.names:
        publish(slurm, n, FATAL)
    cfg = config(tmp_path, slurm, bin_dir=bins, lease=lease)
    files = FileLease(lease)

    def holder() -> str | None:
        got = files.get()
        return str(got.spec.get("holderIdentity")) if got else None

    def records() -> dict[str, Any]:
        out = {}
        for n, raw in slurm.nodes().items():
            out[n] = decode_record(str(raw.get("comment") or ""))
        return out

    a = start("a", cfg, tmp_path, env={"GV_ID": "a"}, skewed=False)
    try:
        wait_for(lambda: holder() == "a", 60, "a to lead")
        b = start("b", cfg, tmp_path, env={"GV_ID": "b"}, skewed=True)
        try:
            run_disruptions(
                a, b, holder=holder, lease_s=6,
                acted=lambda who: log.exists() and f"\n{who}\t" in "\n" + log.read_text(),
            )  # fmt: skip

            def all_done() -> bool:  # each node through its ladder to a quarantine, in turn
                recs = records()
                return all(r is not None and r.state is State.QUARANTINED for r in recs.values())

            wait_for(all_done, 300, "every node through the ladder, one at a time")
        finally:
            b.stop()
    finally:
        a.stop()
        for n in slurm.names:  # leave no record behind for the next test
            slurm.run("scontrol", "update", f"NodeName={n}", "Comment=", check=False)
            publish(slurm, n)
    check_log(log.read_text().splitlines(), lease)


def check_log(lines: list[str], lease: Path) -> None:
    writers, stores = set(), []
    wrong = []
    for line in lines:
        who, version, holder, args = line.split("\t", 3)
        argv = args.split(SEP)
        writers.add(who)
        if holder != who:
            wrong.append((who, version, holder, argv[:3]))
        node = next((a.split("=", 1)[1] for a in argv if a.startswith("NodeName=")), None)
        comment = next((a.split("=", 1)[1] for a in argv if a.startswith("Comment=")), None)
        if node and comment is not None:
            stores.append((node, comment))
    assert writers == {"a", "b"}, f"both should have led at some point: {writers}"
    assert not wrong, f"writes by a replica that did not hold the lease: {wrong[:5]}"
    assert len(stores) > 8, "too few writes to judge"
    assert max_in_budget(stores) == BUDGET
    holders = []
    for p in sorted(lease.glob("lease.*.json")):
        holders.append(json.loads(p.read_text())["spec"]["holderIdentity"])
    assert "a" in holders and "b" in holders
    assert os.access(lease, os.W_OK) and time.time()  # the folder stays usable
