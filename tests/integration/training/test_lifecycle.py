"""The job's life on real torchrun: drains that lose nothing, a frozen rank named by the
monitor outside it, the job's own events read by layer 4's real report, and the example
running from a copy outside the repository."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.training import manifest
from testkit import cli_env

from .conftest import EXAMPLE, STEPS, Job, params_equal, report, wait_for

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(300)]


def _stopped_at(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"gpuvigil drain: stopped after step (\d+) with its", text)]


def test_sigterm_drains_finishes_the_step_saves_and_exits_89(baseline: Job, job: Any) -> None:
    """An eviction's SIGTERM to the launcher (a pod's PID 1): every rank finishes its step,
    they agree on the step to stop after, save it, and exit with DRAINED; the launcher exits
    89 too. The job resumed elsewhere loses no step and ends bit-identical."""
    j: Job = job()
    j.start(faults="slow@*:0:0=150", every=100)  # no periodic save before the drain
    wait_for(lambda: j.worker_pid(1, 0) is not None, timeout=120, what="the ranks")
    wait_for(lambda: "first step of this attempt done" in j.text(), timeout=60, what="a step")
    assert j.proc is not None
    j.proc.send_signal(signal.SIGTERM)
    assert j.wait(timeout=120) == exit_codes.DRAINED, j.text()[-4000:]
    log = j.text()
    stops = _stopped_at(log)
    assert len(stops) == 2 and len(set(stops)) == 1, log[-3000:]  # both ranks, same step
    stop = stops[0]
    assert 0 < stop < STEPS
    assert [s for s, _ in manifest.committed(j.storage())] == [stop]
    assert "exiting with 89 (DRAINED: every rank saved its checkpoint)" in log

    resumed = job(f"{j.dir.name}-elsewhere")  # the platform reschedules the job
    assert resumed.run(ckpt=j.ckpt, env={"GPUVIGIL_JOB_ID": j.dir.name}) == 0
    (restart,) = resumed.event_list("job.restart")
    d = restart["data"]
    assert (d["cause"], d["kind"], d["exit_code"], d["resumed_step"]) == (
        "drain",
        "drained",
        89,
        stop,
    )
    assert d["lost_steps"] == 0  # lost steps after resume: none (at most 1 allowed)
    assert params_equal(resumed.final, baseline.final)
    success = report(j.events, resumed.events)["slo"]["job_success"]
    assert (success["succeeded"], success["failed"], success["achieved"]) == (1, 0, 1.0)


def test_a_drain_the_launcher_records_and_the_resume_count_as_one_success(job: Any) -> None:
    """Rank 1 alone gets SIGTERM (a node's agent signals only its own workers): both ranks
    drain and exit 89, torchrun gives up (no restarts), and the launcher writes the job.end
    of that attempt itself, `interrupted`. The job resumed elsewhere finishes; `gpuvigil
    report` counts one job, succeeded (it read 50% when the launcher wrote `failed`)."""
    j: Job = job()
    # 150 ms steps: at full speed the 24 steps end before the ranks' next drain agreement
    # (every check_s / step time steps), and a job that finished is right to exit 0
    rc = j.run(faults="term@1:3,slow@*:0:0=150", max_restarts=0)
    assert rc == exit_codes.DRAINED, j.text()[-4000:]
    (end,) = j.event_list("job.end")
    assert (end["data"]["result"], end["data"]["exit_code"]) == ("interrupted", 89)
    resumed = job(f"{j.dir.name}-elsewhere")
    assert resumed.run(ckpt=j.ckpt, env={"GPUVIGIL_JOB_ID": j.dir.name}) == 0
    (restart,) = resumed.event_list("job.restart")
    assert (restart["data"]["cause"], restart["data"]["kind"]) == ("drain", "drained")
    rep = report(j.events, resumed.events)
    success = rep["slo"]["job_success"]
    assert (success["succeeded"], success["failed"], success["achieved"]) == (1, 0, 1.0)
    assert rep["attribution"]["by_cause"]["user_code"] == 0


def test_plain_torchrun_forwards_sigterm_and_the_ranks_still_drain(job: Any) -> None:
    """torch 2.13's torchrun forwards SIGTERM to every rank's process group and waits its
    --shutdown-timeout (30 s by default) before SIGKILL: the ranks drain within it, but
    torchrun itself exits 1. gpuvigil's launcher is what turns that into exit code 89."""
    j: Job = job()
    j.start(faults="slow@*:0:0=150", every=100, torchrun=True)
    wait_for(lambda: "first step of this attempt done" in j.text(), timeout=120, what="a step")
    assert j.proc is not None
    j.proc.send_signal(signal.SIGTERM)
    assert j.wait(timeout=120) == 1, j.text()[-4000:]
    stops = _stopped_at(j.text())
    assert len(stops) == 2 and len(set(stops)) == 1
    assert [s for s, _ in manifest.committed(j.storage())] == stops[:1]


def _log_time(text: str, needle: str) -> float:
    for line in text.splitlines():
        if needle in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"{needle!r} not in the log")


def test_a_frozen_rank_is_named_and_the_group_restarts_within_timeout_plus_5s(
    baseline: Job, job: Any
) -> None:
    """SIGSTOP freezes rank 1 whole: its own watchdog cannot run, its peer waits in the
    all-reduce, and torchrun alone would wait 30 s more for it after the peer's watchdog.
    The launcher's monitor names it (rank, node, state) and SIGKILLs it; torchrun starts
    the next attempt within the hang timeout plus 5 s. Layer 4's real `gpuvigil report`,
    over the events the job wrote, attributes the restart to a hang, counts the job as
    succeeded and its goodput below 1."""
    timeout_s = 3.0
    j: Job = job()
    j.start(
        faults="slow@*:0:*=100",
        env={
            "GPUVIGIL__TRAINING__WATCHDOG__TIMEOUT_S": str(timeout_s),
            "GPUVIGIL__TRAINING__WATCHDOG__POLL_S": "0.2",
            "GPUVIGIL__TRAINING__MONITOR__POLL_S": "0.2",
        },
    )
    wait_for(
        (j.ckpt / manifest.dir_name(8) / manifest.MANIFEST).exists,
        timeout=120,
        what="the checkpoint of step 8",
    )
    pid = j.worker_pid(1, 0)
    assert pid is not None
    import os

    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    assert j.wait(timeout=200) == 0, j.text()[-4000:]
    log = j.text()
    named = f"rank 1 (local 1, pid {pid}) on node vm is frozen (stopped by a signal)"
    assert named in log
    restarted = _log_time(log.split(named, 1)[1], "gpuvigil launch: starting the workers")
    assert restarted - frozen_at <= timeout_s + 5, restarted - frozen_at
    assert j.attempts() == {0, 1}
    assert params_equal(j.final, baseline.final)
    (hang,) = [e for e in j.event_list("hang") if e["data"].get("by") == "monitor"]
    assert (hang["data"]["rank"], hang["node"], hang["data"]["reason"]) == (1, "vm", "frozen")
    assert (hang["data"]["culprit_rank"], hang["data"]["culprit"]) == (1, True)
    # Rank 0's own watchdog fired first, on its timeout: rank 1 published no number.
    (mine,) = [e["data"] for e in j.event_list("hang") if e["data"].get("by") != "monitor"]
    assert (mine["rank"], mine["culprit_rank"], mine["verdict"]) == (0, 1, "silent"), mine
    (restart,) = j.event_list("job.restart")
    assert (restart["data"]["cause"], restart["data"]["kind"], restart["data"]["rank"]) == (
        "hang",
        "frozen",
        1,
    )

    rep = report(j.events)
    slo, attribution = rep["slo"], rep["attribution"]
    assert slo["job_success"]["succeeded"] == 1 and slo["job_success"]["failed"] == 0
    assert slo["job_success"]["restarts"] == 1
    assert 0 < slo["goodput"]["ratio"] < 1
    (failure,) = attribution["failures"]
    assert failure["event"] == "job.restart" and failure["cause"] == "hang", failure
    assert attribution["by_cause"]["user_code"] == 0


def test_the_example_runs_from_a_copy_outside_the_repository(tmp_path: Path) -> None:
    """What a user does: copy the example and run it (gpuvigil installed, no test code)."""
    copy = tmp_path / "elsewhere" / "train.py"
    copy.parent.mkdir()
    shutil.copy(EXAMPLE, copy)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuvigil.training.launch",
            "--standalone",
            "--nproc-per-node=1",
            str(copy),
            "--steps",
            "4",
            "--checkpoint-dir",
            "ckpt",
            "--checkpoint-every",
            "2",
        ],
        cwd=copy.parent,
        env=cli_env(
            {"GPUVIGIL__TRAINING__HEALTH_GATE__ON_MISSING": "allow", "OMP_NUM_THREADS": "1"}
        ),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert (copy.parent / "ckpt" / manifest.dir_name(4) / manifest.MANIFEST).exists()
