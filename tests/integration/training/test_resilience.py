"""Layer 3 against real processes: torchrun, gloo, 2-4 CPU ranks, SIGKILL, hangs, slow ranks.

Every job trains the same deterministic model for the same number of steps, so every fault
test ends by comparing its final parameters with the uninterrupted baseline, bit for bit.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.core.findings import Action, Finding, NodeReport, Status
from gpuvigil.io.ports import free_port
from gpuvigil.training import manifest

from .conftest import STEPS, Job, kill_worker, listening, params_equal, wait_for

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(240)]


def test_sigkill_mid_run_resumes_from_a_relative_checkpoint_dir_bit_identical(
    baseline: Job, job: Any
) -> None:
    """Issue #15's repro: `--checkpoint-dir ckpt` (relative) once lost every checkpoint
    (the rank files went to ckpt/ckpt/step-N) and restarted from step 0."""
    j: Job = job()
    j.start(faults="slow@*:0:*=100", ckpt="ckpt")  # cwd is the job's folder
    done_8 = j.dir / "ckpt" / manifest.dir_name(8) / manifest.MANIFEST
    wait_for(done_8.exists, timeout=120, what="the checkpoint of step 8")
    pid = j.worker_pid(1, 0)
    assert pid is not None and kill_worker(pid), "rank 1 was not running"
    assert j.wait() == 0, j.text()[-4000:]
    assert j.attempts() == {0, 1}
    assert not (j.dir / "ckpt" / "ckpt").exists()
    resumed = re.search(r"resumed from (\S+)/step-0+(\d+) \(step", j.text())
    assert resumed and resumed.group(1) == str(j.dir / "ckpt"), j.text()[-3000:]
    assert int(resumed.group(2)) >= 8
    assert params_equal(j.final, baseline.final)
    # The job's own record of it: started once, restarted once naming the dead rank, ended.
    kinds = [e["kind"] for e in j.event_list() if e["kind"].startswith("job.")]
    assert kinds == ["job.start", "job.restart", "job.end"]
    (restart,) = j.event_list("job.restart")
    d = restart["data"]
    assert restart["source"] == "training" and restart["job"] == j.dir.name
    assert (d["cause"], d["kind"], d["rank"], d["node"], d["exit_code"]) == (
        "unknown",
        "dead",
        1,
        "vm",
        -9,
    )
    assert d["attempt"] == 1 and d["resumed_step"] >= 8 and d["lost_s"] > 0
    assert 0 <= d["lost_steps"] <= 4
    assert f"rank 1 (pid {pid}) on node vm died: killed by SIGKILL" in j.text()
    commits = [e["data"]["step"] for e in j.event_list("checkpoint") if e["data"]["result"] == "ok"]
    assert {8, 24} <= set(commits)
    (end,) = j.event_list("job.end")
    assert end["data"] == {"result": "succeeded", "exit_code": 0, "steps": STEPS}


@pytest.mark.timeout(700)
def test_ten_kills_ten_clean_restarts(baseline: Job, job: Any) -> None:
    # Attempt i kills rank i%2 at step 3+2i: ten restarts of the group in one job, each
    # resuming from a checkpoint (every 2 steps) and reaching the next kill.
    kills = ",".join(f"kill@{i % 2}:{3 + 2 * i}:{i}" for i in range(10))
    j: Job = job()
    rc = j.run(faults=kills, every=2, max_restarts=10, timeout=600, torchrun=True)
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
    saved = json.loads((a.ckpt / manifest.dir_name(20) / "global.json").read_text())
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
    # Every record that was written names rank 1, with the sequence numbers as evidence:
    # rank 0 entered the step's all-reduce, rank 1 (asleep in its own code) never did.
    for d in by_rank.values():
        assert (d["culprit_rank"], d["verdict"]) == (1, "behind"), d
        assert d["seqs"]["0"] == d["seqs"]["1"] + 1, d
    assert culprit["culprit"] is True and by_rank.get(0, {"culprit": False})["culprit"] is False
    assert "(this rank is the culprit: rank 1 entered" in log
    assert "likely a victim" not in log
    assert j.attempts() == {0, 1}
    assert params_equal(j.final, baseline.final)


def test_a_rank_that_never_enters_the_all_reduce_is_named_the_culprit(job: Any) -> None:
    """Rank 1 hangs inside backward, before DDP's gradient all-reduce: both ranks' stacks
    are in torch (each alone would call itself "likely a victim"). Their collective sequence
    numbers tell them apart: rank 0 entered one more collective than rank 1, so rank 1 is
    named the culprit, by both, and the restart names it."""
    j: Job = job()
    rc = j.run(
        faults="hangbwd@1:5",
        env={
            "GPUVIGIL__TRAINING__WATCHDOG__TIMEOUT_S": "3",
            "GPUVIGIL__TRAINING__WATCHDOG__POLL_S": "0.2",
        },
    )
    assert rc == 0, j.text()[-4000:]
    by_rank = {e["data"]["rank"]: e["data"] for e in j.event_list("hang")}
    assert set(by_rank) == {0, 1}, j.text()[-4000:]
    assert by_rank[1]["in_collective"] is True  # its stack alone says "victim"...
    assert by_rank[1]["culprit"] is True and by_rank[1]["behind"] == [1]  # ...the numbers don't
    assert by_rank[0]["culprit"] is False and by_rank[0]["behind"] == [1]
    assert by_rank[0]["seq"] == by_rank[1]["seq"] + 1
    log = j.text()
    assert "(the culprit is rank 1: rank 1 entered" in log and "this rank is a victim)" in log
    assert "(this rank is the culprit: rank 1 entered" in log
    assert by_rank[0]["culprit_rank"] == by_rank[1]["culprit_rank"] == 1
    (restart,) = j.event_list("job.restart")
    d = restart["data"]
    assert (d["cause"], d["kind"], d["rank"]) == ("hang", "behind", 1)


def test_a_rank_1_3x_slower_in_backward_is_named_within_100_steps(job: Any) -> None:
    """Every rank's step takes 100 ms; rank 2's backward takes 30 ms more (1.3x). Its wall
    time equals its peers' (they wait for it in the gradient all-reduce), and its forward
    pass is as fast as theirs: only busy time (whole step minus the wait) names it."""
    j: Job = job()
    prom = j.dir / "metrics-{rank}.prom"
    rc = j.run(
        nproc=3,
        steps=100,
        every=50,
        faults="slow@*:0:*=100,slowbwd@2:0:*=30",
        env={"GPUVIGIL__TRAINING__METRICS__TEXTFILE": str(prom)},  # default sensitivity
        timeout=240,
    )
    assert rc == 0, j.text()[-4000:]
    reports = j.event_list("straggler")
    assert reports and {e["data"]["rank"] for e in reports} == {2}, reports
    first = reports[0]["data"]
    assert first["step"] <= 100 and 1.2 < first["ratio"] < 1.6, first
    assert reports[0]["node"] == "vm"
    assert "gpuvigil straggler: rank 2 on node vm is" in j.text()
    metrics = Path(str(prom).format(rank=0)).read_text()
    assert 'gpuvigil_training_stragglers_total{node="vm"}' in metrics


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
    env.pop("GPUVIGIL__TRAINING__HEALTH_GATE__ON_MISSING", None)
    p = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == exit_codes.NODE_STATE_UNKNOWN, p.stderr
    assert "refusing to run: cannot read" in p.stderr and "on_missing=allow" in p.stderr
