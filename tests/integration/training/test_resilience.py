"""Layer 3 against real processes: torchrun, gloo, 2-4 CPU ranks, SIGKILL, hangs, slow ranks.

Every job trains the same deterministic model for the same number of steps, so every fault
test ends by comparing its final parameters with the uninterrupted baseline, bit for bit.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.core.findings import Action, Finding, NodeReport, Status
from gpuvigil.training import manifest

from .conftest import Job, free_port, kill_worker, listening, params_equal, wait_for

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(240)]


def test_sigkill_one_worker_mid_run_resumes_bit_identical(baseline: Job, job: Any) -> None:
    j: Job = job()
    j.start(faults="slow@*:0:*=100")  # 100 ms steps: room to kill from outside mid-run
    done_8 = j.ckpt / manifest.dir_name(8) / manifest.MANIFEST
    wait_for(done_8.exists, timeout=90, what="the checkpoint of step 8")
    pid = j.worker_pid(1, 0)
    assert pid is not None and kill_worker(pid), "rank 1 was not running"
    assert j.wait() == 0, j.text()[-4000:]
    assert j.attempts() == {0, 1}
    assert "resumed from" in j.text()
    assert params_equal(j.final, baseline.final)
    # The platform's record of it: one restart resumed at or after step 8, and commits.
    (restart,) = j.event_list("job.restart")
    assert restart["source"] == "training" and restart["data"]["attempt"] == 1
    assert restart["data"]["resumed_step"] >= 8 and restart["data"]["lost_s"] >= 0
    commits = [
        e["data"]["step"] for e in j.event_list("checkpoint") if e["data"]["result"] == "committed"
    ]
    assert {8, 24} <= set(commits)


def test_ten_kills_ten_clean_restarts(baseline: Job, job: Any) -> None:
    # Attempt i kills rank i%2 at step 3+2i: ten restarts of the group in one job, each
    # resuming from a checkpoint (every 2 steps) and reaching the next kill.
    kills = ",".join(f"kill@{i % 2}:{3 + 2 * i}:{i}" for i in range(10))
    j: Job = job()
    rc = j.run(faults=kills, every=2, max_restarts=10, timeout=200)
    assert rc == 0, j.text()[-4000:]
    assert j.attempts() == set(range(11))  # 10 of 10 restarts formed the group again
    assert "store prefix gpuvigil/restart-10 (restart 10)" in j.text()
    assert "connectFullMesh" not in j.text()
    assert params_equal(j.final, baseline.final)


def test_kill_during_checkpoint_commit_resumes_from_previous(baseline: Job, job: Any) -> None:
    j: Job = job()
    assert j.run(faults="killsave@0:8") == 0, j.text()[-4000:]
    log = j.text()
    assert "step-000000008 was never committed (its save was interrupted); skipping it" in log
    assert "resumed from " + str(j.ckpt / manifest.dir_name(4)) in log
    assert params_equal(j.final, baseline.final)


def test_corrupt_latest_checkpoint_falls_back_with_a_clear_log_line(
    baseline: Job, job: Any
) -> None:
    j: Job = job()
    shutil.copytree(baseline.ckpt, j.ckpt)  # checkpoints 16, 20 and 24 (keep_last 3)
    data = j.ckpt / manifest.dir_name(24) / "__1_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped bit, same size: only the checksum sees it
    data.write_bytes(bytes(raw))
    assert j.run() == 0, j.text()[-4000:]
    log = j.text()
    assert (
        "gpuvigil checkpoint: step-000000024 is DAMAGED (file __1_0.distcp fails its SHA-256 check"
    ) in log
    assert "falling back to the previous checkpoint" in log
    assert "resumed from " + str(j.ckpt / manifest.dir_name(20)) in log
    assert params_equal(j.final, baseline.final)


def test_losing_a_node_shrinks_4_to_2_then_grows_to_3(job: Any) -> None:
    """Two torchrun agents ("nodes") of 2 ranks each, elastic 1-2 nodes. Node b is lost
    (its agent and workers SIGKILLed together, as when a machine dies): node a's agent
    re-forms the group with 2 ranks, resumes the 4-rank checkpoint and finishes. A relaunch
    with 3 ranks then resumes the 2-rank checkpoint."""
    import torch

    a: Job = job("node-a")
    b: Job = job("node-b")
    port = free_port()
    slow = "slow@*:0:0=300"  # slow first attempt only: time to lose node b mid-run
    a.start(steps=16, faults=slow, ckpt=a.ckpt, elastic=("node-a", port))
    wait_for(lambda: listening(port), timeout=60, what="the rendezvous store of node a")
    b.start(steps=16, faults=slow, ckpt=a.ckpt, elastic=("node-b", port))
    wait_for(
        (a.ckpt / manifest.dir_name(4) / manifest.MANIFEST).exists,
        timeout=120,
        what="a checkpoint saved by 4 ranks",
    )
    assert b.proc is not None
    b.proc.kill()  # the whole machine dies: its agent and, below, its workers
    for rank in (2, 3):
        pid = b.worker_pid(rank, 0)
        assert pid is not None and kill_worker(pid)
    assert a.wait(timeout=180) == 0, a.text()[-4000:]
    shrunk = re.search(r"\(step (\d+), saved by 4 ranks, now 2\)", a.text())
    assert shrunk, a.text()[-4000:]
    assert "rank 0/2 on node-a" in a.text()
    resumed = int(shrunk.group(1))

    c: Job = job("relaunch")
    assert c.run(nproc=3, steps=20, ckpt=a.ckpt) == 0, c.text()[-4000:]
    assert "(step 16, saved by 2 ranks, now 3)" in c.text()
    saved = torch.load(a.ckpt / manifest.dir_name(20) / "rank-00000.pt", weights_only=False)
    # The data position is global: each step consumed 16 samples per rank of its world.
    consumed = resumed * 4 * 16 + (16 - resumed) * 2 * 16 + 4 * 3 * 16
    assert saved["sampler"]["consumed"] == consumed and saved["world_size"] == 3
    assert all(torch.isfinite(t).all() for t in torch.load(c.final).values())


def test_hung_rank_watchdog_fires_dumps_stacks_and_group_restarts(baseline: Job, job: Any) -> None:
    timeout_s = 3.0
    j: Job = job()
    rc = j.run(
        faults="hang@1:6",
        env={
            "GPUVIGIL__TRAINING__WATCHDOG__TIMEOUT_S": str(timeout_s),
            "GPUVIGIL__TRAINING__WATCHDOG__POLL_S": "0.2",
        },
    )
    assert rc == 0, j.text()[-4000:]
    log = j.text()
    assert f"exitcode: {exit_codes.HANG}" in log  # torchrun saw the watchdog's exit code
    hangs = j.event_list("hang")
    by_rank = {e["data"]["rank"]: e["data"] for e in hangs}
    culprit = by_rank[1]
    assert culprit["reason"] == "timeout" and culprit["step"] == 6
    assert culprit["waited_s"] <= timeout_s + 0.2 + 2.0  # timeout + poll + slack
    assert "faults.py" in culprit["where"] and culprit["in_collective"] is False
    dump = Path(culprit["stack_file"]).read_text()
    assert "at_step" in dump and "train_resilient.py" in dump
    if 0 in by_rank:  # the peer blocked in the gradient all-reduce is marked as a victim
        assert by_rank[0]["in_collective"] is True
    assert j.attempts() == {0, 1}
    assert params_equal(j.final, baseline.final)


def test_slow_rank_is_reported_as_straggler_and_no_other(job: Any) -> None:
    j: Job = job()
    prom = j.dir / "metrics-{rank}.prom"
    rc = j.run(
        nproc=3,
        faults="slow@2:0:*=60",
        env={
            "GPUVIGIL__TRAINING__STRAGGLER__EVERY_STEPS": "4",
            "GPUVIGIL__TRAINING__STRAGGLER__WINDOWS": "2",
            "GPUVIGIL__TRAINING__METRICS__TEXTFILE": str(prom),
        },
    )
    assert rc == 0, j.text()[-4000:]
    reports = j.event_list("straggler")
    assert reports and {e["data"]["rank"] for e in reports} == {2}
    assert reports[0]["node"] and reports[0]["data"]["ratio"] > 1.5
    assert "gpuvigil straggler: rank 2 on node" in j.text()
    metrics = Path(str(prom).format(rank=0)).read_text()
    assert f'gpuvigil_training_stragglers_total{{node="{reports[0]["node"]}"}} 1.0' in metrics


def _unhealthy(path: Path) -> None:
    f = Finding(
        check="xid",
        status=Status.FAILED,
        code="XID_79",
        component="gpu:3",
        action=Action.RESET_GPU,
        fatal=True,
        message="GPU has fallen off the bus",
    )
    path.write_text(NodeReport(node="vm", findings=(f,)).model_dump_json())


def test_unhealthy_node_refuses_to_start(job: Any, tmp_path: Path) -> None:
    j: Job = job()
    j.state_file = tmp_path / "state.json"
    _unhealthy(j.state_file)
    rc = j.run(max_restarts=0)
    assert rc != 0
    log = j.text()
    assert f"exitcode: {exit_codes.NODE_UNHEALTHY}" in log
    assert "refusing to run on node vm: status FAILED: XID_79 on gpu:3" in log
    assert not j.final.exists()


def test_missing_node_state_fails_closed_without_torchrun(tmp_path: Path) -> None:
    import subprocess

    from testkit import cli_env

    from .conftest import EXAMPLE

    env = cli_env({"GPUVIGIL__TRAINING__HEALTH_GATE__STATE_FILE": str(tmp_path / "absent")})
    p = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == exit_codes.NODE_STATE_UNKNOWN, p.stderr
    assert "refusing to run: cannot read" in p.stderr and "on_missing=allow" in p.stderr
