"""In-process restart on a real 3-rank gloo job (CPU), one process per rank started here:
SIGKILL rank 1 mid-run, start a replacement, and the survivors (ranks 0 and 2) keep their
processes, the group re-forms in generation 1, and the job ends bit-identical to an
uninterrupted run. Without a replacement the survivors exit 93 within the bound."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from testkit import cli_env

from .conftest import params_equal, wait_for

JOB = Path(__file__).resolve().parent / "inprocess_job.py"
WORLD, STEPS, K, EVERY = 3, 30, 2, 10  # memtier every K steps, DCP every EVERY
KILL_AFTER = 12  # rank 1 is SIGKILLed once it reported this many completed steps


class InProcessJob:
    """A store server and one subprocess per rank, as a Job's pods would be."""

    def __init__(self, root: Path, *, state_file: Path, join_timeout_s: float) -> None:
        self.dir = root
        root.mkdir(parents=True)
        self.progress = root / "progress.jsonl"
        self.final = root / "final.pt"
        self.state_file, self.join_timeout_s = state_file, join_timeout_s
        self.procs: dict[int, list[subprocess.Popen[bytes]]] = {}
        self.store = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuvigil.training.inprocess",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
        assert self.store.stdout is not None
        line = self.store.stdout.readline().decode()
        assert "serving on" in line, line
        self.port = int(line.rsplit(":", 1)[1])

    def start(self, rank: int) -> subprocess.Popen[bytes]:
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "LOCAL_RANK": "0",
            "NODE_NAME": f"node{rank}",
            "GPUVIGIL_JOB_ID": "inproc",
            "GPUVIGIL__TRAINING__RESTART__IN_PROCESS": "true",
            "GPUVIGIL__TRAINING__RESTART__STORE": f"127.0.0.1:{self.port}",
            "GPUVIGIL__TRAINING__RESTART__JOIN_TIMEOUT_S": str(self.join_timeout_s),
            "GPUVIGIL__TRAINING__MEMTIER__ENABLED": "true",
            "GPUVIGIL__TRAINING__MEMTIER__EVERY_STEPS": str(K),
            # `{rank}`: each rank is its own machine with its own /dev/shm
            "GPUVIGIL__TRAINING__MEMTIER__DIR": str(self.dir / "shm" / "{rank}"),
            "GPUVIGIL__TRAINING__HEALTH_GATE__STATE_FILE": str(self.state_file),
            "GPUVIGIL_EVENTS_FILE": str(self.dir / "events.jsonl"),
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        n = len(self.procs.get(rank, []))
        with open(self.dir / f"rank{rank}-{n}.log", "ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(JOB),
                    "--steps",
                    str(STEPS),
                    "--checkpoint-dir",
                    str(self.dir / "ckpt"),
                    "--checkpoint-every",
                    str(EVERY),
                    "--save-final",
                    str(self.final),
                    "--progress",
                    str(self.progress),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=cli_env(env),
                cwd=self.dir,
            )
        self.procs.setdefault(rank, []).append(proc)
        return proc

    def lines(self) -> list[dict[str, Any]]:
        if not self.progress.exists():
            return []
        raw = self.progress.read_text().splitlines()
        return [json.loads(x) for x in raw if x.endswith("}")]

    def done(self, rank: int) -> int:
        return max((x["step"] for x in self.lines() if x["rank"] == rank), default=0)

    def text(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.dir.glob("rank*.log"))
        )

    def wait(self, proc: subprocess.Popen[bytes], timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for procs in self.procs.values():  # every live rank's stacks into its log
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
            time.sleep(1)
            pytest.fail(f"rank did not end in {timeout}s; logs:\n{self.text()}")

    def stop(self) -> None:
        for procs in self.procs.values():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.store.send_signal(signal.SIGTERM)
        try:
            self.store.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.store.kill()
            self.store.wait()


@pytest.fixture
def inproc(workdir: Path, healthy_state: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[InProcessJob] = []

    def make(name: str, *, join_timeout_s: float = 60.0) -> InProcessJob:
        j = InProcessJob(
            workdir / f"{request.node.name}-{name}",
            state_file=healthy_state,
            join_timeout_s=join_timeout_s,
        )
        made.append(j)
        return j

    yield make
    for j in made:
        j.stop()


def _kill_rank1(j: InProcessJob, *, after: int) -> float:
    """SIGKILL rank 1 once it completed `after` steps, and wipe its machine's memory tier
    (the machine is gone); returns when."""
    wait_for(lambda: j.done(1) >= after, timeout=45, what=f"rank 1 to complete {after} steps")
    victim = j.procs[1][0]
    victim.send_signal(signal.SIGKILL)
    killed = time.time()
    victim.wait(timeout=10)
    shutil.rmtree(j.dir / "shm" / "1", ignore_errors=True)
    return killed


def _logged(log: Path, text: str) -> float:
    """When the first log line containing `text` was written (the job's logging format)."""
    line = next(x for x in log.read_text().splitlines() if text in x)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


@pytest.fixture(scope="module")
def baseline(workdir: Path, healthy_state: Path) -> Iterator[InProcessJob]:
    """The uninterrupted 3-rank run (in-process mode, no fault) every test must match."""
    base = InProcessJob(workdir / "inprocess-baseline", state_file=healthy_state, join_timeout_s=60)
    try:
        for p in [base.start(r) for r in range(WORLD)]:
            assert base.wait(p, 60) == 0, base.text()
        yield base
    finally:
        base.stop()


@pytest.mark.parametrize("tier", ["memory", "persistent"])
def test_survivors_keep_their_processes_and_the_job_ends_bit_identical(
    inproc: Any, baseline: InProcessJob, tier: str
) -> None:
    """`persistent`: rank 1's copy is gone from its peer too (two machines' worth of tier
    lost), so every rank rolls back to the DCP checkpoint of step 10 instead."""
    j = inproc("killed")
    procs = {r: j.start(r) for r in range(WORLD)}
    kill_after = KILL_AFTER if tier == "memory" else KILL_AFTER + K  # DCP's step 10 committed
    killed = _kill_rank1(j, after=kill_after)
    if tier == "persistent":
        for copy in (j.dir / "shm" / "2").glob("peer-r00001-*"):
            copy.unlink()
    replacement = j.start(1)
    for r, p in {0: procs[0], 2: procs[2], 1: replacement}.items():
        assert j.wait(p, 60) == 0, f"rank {r}:\n{j.text()}"

    assert params_equal(j.final, baseline.final)
    lines = j.lines()
    # The survivors never restarted: one pid each, from the first step to the last, and
    # it is the process this test started.
    for r in (0, 2):
        mine = [x for x in lines if x["rank"] == r]
        assert {x["pid"] for x in mine} == {procs[r].pid}, mine
        assert {x["gen"] for x in mine} == {0, 1}, "the group re-formed in generation 1"
        assert mine[-1]["step"] == STEPS
    # Only rank 1 started again: its replacement trained in generation 1, from the step
    # every rank agreed on (rank 1's copy fetched from its peer rank 2).
    again = [x for x in lines if x["rank"] == 1 and x["pid"] == replacement.pid]
    assert again and {x["gen"] for x in again} == {1}
    resumed = again[0]["step"] - 1
    log1 = (j.dir / "rank1-1.log").read_text()
    if tier == "memory":
        assert KILL_AFTER - K <= resumed <= KILL_AFTER + 1 and resumed % K == 0, resumed
        assert f"rank 1 restored step {resumed} from its peer rank 2" in log1, log1[-3000:]
    else:
        assert resumed == EVERY, resumed
        assert "falling back to the persistent tier" in log1, log1[-3000:]
        assert "resumed from" in (j.dir / "rank0-0.log").read_text()
    for r in (0, 2):
        log = (j.dir / f"rank{r}-0.log").read_text()
        assert f"rank {r} lost a peer in generation 0" in log
        assert "generation 1 formed" in log
    after = [x["ts"] for x in lines if x["rank"] in (0, 2) and x["gen"] == 1]
    recovered = min(after) - killed
    seen = min(_logged(j.dir / f"rank{r}-0.log", "lost a peer") for r in (0, 2)) - killed
    formed = _logged(j.dir / "rank0-0.log", "generation 1 formed") - killed
    print(
        f"\nin-process restart: the survivors' next completed step came {recovered:.2f}s "
        f"after rank 1 was SIGKILLed (loss seen after {seen:.2f}s, generation 1 formed after "
        f"{formed:.2f}s, the replacement started at once; resumed at step {resumed} from the "
        f"{tier} tier, killed after step {kill_after})"
    )
    assert recovered < 45


def test_no_replacement_survivors_exit_93_naming_the_missing_rank(inproc: Any) -> None:
    bound = 4.0
    j = inproc("alone", join_timeout_s=bound)
    procs = {r: j.start(r) for r in range(WORLD)}
    killed = _kill_rank1(j, after=4)
    for r in (0, 2):
        assert j.wait(procs[r], 40) == 93, j.text()
        log = (j.dir / f"rank{r}-0.log").read_text()
        assert "rank 1 never joined generation 1" in log, log[-3000:]
        assert "RANK_NOT_REPLACED" in log
    took = time.time() - killed
    print(f"\nno replacement: the survivors exited 93 {took:.2f}s after the kill (bound {bound}s)")
    assert took < bound + 20


def test_a_drain_costs_only_the_drained_rank(inproc: Any, baseline: InProcessJob) -> None:
    """SIGTERM rank 1 (the controller drains its node): every rank keeps the agreed step in
    the in-memory tier, only rank 1 exits 89, ranks 0 and 2 keep their processes and re-form
    with its replacement (on a spare: rank 1's machine memory is gone), which fetches rank 1's
    copy of that very step from its peer. No step is lost, and the weights match."""
    j = inproc("drained")
    procs = {r: j.start(r) for r in range(WORLD)}
    wait_for(lambda: j.done(1) >= KILL_AFTER, timeout=45, what="rank 1 to reach the drain")
    procs[1].send_signal(signal.SIGTERM)
    signalled = time.time()
    assert j.wait(procs[1], 30) == 89, j.text()
    shutil.rmtree(j.dir / "shm" / "1", ignore_errors=True)  # the replacement is on a spare
    replacement = j.start(1)
    for r, p in {0: procs[0], 2: procs[2], 1: replacement}.items():
        assert j.wait(p, 60) == 0, f"rank {r}:\n{j.text()}"

    assert params_equal(j.final, baseline.final)
    log1 = (j.dir / "rank1-0.log").read_text()
    found = re.search(r"drain: stopped after step (\d+) with its copy in the in-memory tier", log1)
    assert found, log1[-3000:]
    drained = int(found.group(1))
    assert drained >= KILL_AFTER
    lines = j.lines()
    for r in (0, 2):
        mine = [x for x in lines if x["rank"] == r]
        assert {x["pid"] for x in mine} == {procs[r].pid}, mine
        assert {x["gen"] for x in mine} == {0, 1}
        # generation 0 ended at the drain step: the step after it never completed
        assert max(x["step"] for x in mine if x["gen"] == 0) == drained
        log = (j.dir / f"rank{r}-0.log").read_text()
        assert f"rank 1 drained after step {drained}" in log, log[-3000:]
        assert f"rank {r} lost a peer in generation 0" in log
    again = [x for x in lines if x["rank"] == 1 and x["pid"] == replacement.pid]
    resumed = again[0]["step"] - 1
    assert resumed == drained, (resumed, drained)  # 0 steps lost
    assert (
        f"rank 1 restored step {drained} from its peer rank 2"
        in (j.dir / "rank1-1.log").read_text()
    )
    events = [json.loads(x) for x in (j.dir / "events.jsonl").read_text().splitlines()]
    (restart,) = [e["data"] for e in events if e["kind"] == "job.restart"]
    assert (restart["cause"], restart["kind"], restart["rank"]) == ("drain", "drained", 1)
    assert (restart["resumed_step"], restart["lost_steps"], restart["tier"]) == (
        drained,
        0,
        "memory",
    )
    after = min(x["ts"] for x in lines if x["rank"] in (0, 2) and x["gen"] == 1)
    print(
        f"\ndrain under in-process restart: rank 1 drained after step {drained} (SIGTERM "
        f"after its step {KILL_AFTER}), exited 89; the survivors' next completed step came "
        f"{after - signalled:.2f}s after the SIGTERM; resumed at step {resumed}: 0 steps lost"
    )
