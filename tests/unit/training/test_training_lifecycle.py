"""Why an attempt ended: exit records, the culprit among them, job.restart's data; the
heartbeat a rank writes; the monitor outside the rank, on a real frozen process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.training import heartbeat, lifecycle
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.monitor import Monitor, proc_state
from gpuvigil.training.storage import LocalStorage


def rec(kind: str, rank: int, ts: float, step: int = 10) -> lifecycle.ExitRecord:
    return lifecycle.ExitRecord(ts, kind, rank, f"node{rank}", 1, step, "detail")


def test_the_frozen_rank_is_the_culprit_not_the_peers_that_waited_for_it() -> None:
    records = [rec("victim", 0, 1.0), rec("hang", 2, 2.0), rec("frozen", 1, 3.0)]
    assert lifecycle.culprit(records) == records[2]
    assert lifecycle.culprit([rec("drained", 0, 1.0), rec("drained", 1, 0.5)]).rank == 1
    assert lifecycle.culprit([]) is None


def test_a_rank_sigterm_killed_is_not_the_culprit_of_a_peers_sigkill() -> None:
    """The monitor writes torchrun's failures in rank order: rank 0, caught by torchrun's
    SIGTERM on its way out, is recorded before rank 1, whose SIGKILL ended the group (seen
    in `test_sigkill_mid_run_resumes_...` under load). The restart names rank 1."""
    records = [
        lifecycle.ExitRecord(1.0, lifecycle.kind_of_exit(-15), 0, "vm", -15, 12, "SIGTERM"),
        lifecycle.ExitRecord(1.001, lifecycle.kind_of_exit(-9), 1, "vm", -9, 12, "SIGKILL"),
    ]
    c = lifecycle.culprit(records)
    assert c is not None and (c.rank, c.kind, c.exit_code) == (1, "dead", -9)
    assert c.cause is exit_codes.Charged.UNKNOWN


def test_a_drain_names_the_drained_node_not_the_peer_killed_after_it() -> None:
    """The lab's Xid: the platform drains node A (its rank saves and exits 89); the gang is
    stopped, and rank 1 on the healthy node B, waiting for A in a collective, is killed
    past its grace. The restart names A and rank 0; a death before any drain still wins."""
    drained = lifecycle.ExitRecord(1.0, "drained", 0, "node-a", 89, 12, "SIGTERM: drained")
    killed = lifecycle.ExitRecord(9.0, "dead", 1, "node-b", -9, 12, "killed by SIGKILL")
    d = lifecycle.restart_data([killed, drained], attempt=1, resumed_step=10, saved_ts=None,
                               now=10.0)  # fmt: skip
    assert (d["node"], d["rank"], d["cause"], d["kind"]) == ("node-a", 0, "drain", "drained")
    earlier = lifecycle.ExitRecord(0.5, "dead", 1, "node-b", -9, 12, "killed by SIGKILL")
    assert lifecycle.culprit([drained, earlier]) == earlier


def test_restart_data_names_cause_culprit_and_lost_work() -> None:
    records = [rec("victim", 0, 1.0, step=13), rec("dead", 1, 2.0, step=12)]
    d = lifecycle.restart_data(records, attempt=2, resumed_step=10, saved_ts=100.0, now=130.0)
    assert (d["cause"], d["kind"], d["rank"], d["node"], d["lost_steps"], d["lost_s"]) == (
        "unknown",
        "dead",
        1,
        "node1",
        3,
        30.0,
    )
    assert d["reason"].startswith("dead: rank 1 on node1")
    empty = lifecycle.restart_data([], attempt=1, resumed_step=0, saved_ts=None, now=1.0)
    assert empty["cause"] == "unknown" and empty["lost_s"] is None


@pytest.mark.parametrize(
    ("code", "kind", "cause"),
    [
        (86, "hang", "hang"),
        (89, "drained", "drain"),
        (90, "checkpoint_failed", "storage"),
        (91, "no_verified_checkpoint", "storage"),
        (87, "node_unhealthy", "hardware"),
        (-9, "dead", "unknown"),
        (137, "dead", "unknown"),
        (-15, "victim", "unknown"),
        (143, "victim", "unknown"),
        (1, "user_code", "user_code"),
    ],
)
def test_kind_and_cause_of_an_exit_code(code: int, kind: str, cause: str) -> None:
    assert lifecycle.kind_of_exit(code) == kind
    assert lifecycle.cause_of(kind) == cause


def test_every_kind_is_charged_in_the_one_vocabulary() -> None:
    for _kind, cause in lifecycle.KINDS:
        assert cause in exit_codes.Charged
    # where an exit code has a kind, the kind's cause is the one the exit-code table charges
    for code in (86, 87, 89, 90, 91):
        assert lifecycle.cause_of(lifecycle.kind_of_exit(code)) is exit_codes.charged(code)


def test_exit_records_round_trip_and_garbage_is_skipped(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    lifecycle.write_exit(storage, rec("drained", 0, 5.0))
    (tmp_path / lifecycle.EXITS / "garbage.json").write_text("{not json")
    records, names = lifecycle.read_exits(storage)
    assert [(r.kind, r.cause) for r in records] == [("drained", "drain")] and len(names) == 2


def test_heartbeat_round_trip(tmp_path: Path) -> None:
    hb = heartbeat.HeartbeatWriter(tmp_path, local_rank=1, info={"rank": 5, "node": "gpu7"})
    hb.start(100.0, 60.0)
    hb.step(42, 123.5)
    beat = heartbeat.read(tmp_path / "local-1.hb")
    assert beat is not None and (beat.rank, beat.step, beat.last_step_at, beat.timeout_s) == (
        5,
        42,
        123.5,
        60.0,
    )
    assert heartbeat.info(tmp_path / "local-1.hb")["node"] == "gpu7"
    hb.finish()
    assert heartbeat.read(tmp_path / "local-1.hb").timeout_s == 0  # the loop is over: unwatched
    hb.close()
    (tmp_path / "local-2.hb").write_bytes(b"garbage")
    assert heartbeat.read(tmp_path / "local-2.hb") is None


def test_the_monitor_names_and_kills_a_frozen_process(tmp_path: Path) -> None:
    """A real process, SIGSTOPped, whose heartbeat stopped 5 s ago with a 1 s timeout."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while proc_state(sleeper.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        run_dir, events, ckpt = tmp_path / "run", tmp_path / "events.jsonl", tmp_path / "ckpt"
        run_dir.mkdir()
        (run_dir / "local-0.json").write_text(
            json.dumps(
                {
                    "rank": 3,
                    "local_rank": 0,
                    "node": "gpu7",
                    "job": "j1",
                    "pid": sleeper.pid,
                    "checkpoint_dir": str(ckpt),
                    "events_file": str(events),
                }
            )
        )
        from gpuvigil.training.heartbeat import _FMT, _MAGIC

        (run_dir / "local-0.hb").write_bytes(
            _FMT.pack(_MAGIC, sleeper.pid, 3, 17, time.monotonic() - 5, 1.0, 0.0, 0.0, 7)
        )
        cfg = TrainingConfig.load(
            environ={}, overrides={"monitor": {"poll_s": 0.05, "grace_s": 0.5}}
        )
        monitor = Monitor(cfg, run_dir, node="gpu7").start()
        try:
            sleeper.wait(timeout=10)
        finally:
            monitor.stop()
        assert sleeper.returncode == -signal.SIGKILL
        assert monitor.named == [{"rank": 3, "node": "gpu7", "cause": "hang", "kind": "frozen"}]
        (ev,) = [json.loads(line) for line in events.read_text().splitlines()]
        assert (ev["kind"], ev["node"], ev["job"], ev["data"]["reason"]) == (
            "hang",
            "gpu7",
            "j1",
            "frozen",
        )
        (record,), _ = lifecycle.read_exits(LocalStorage(str(ckpt)))
        assert (record.kind, record.rank, record.exit_code, record.by) == (
            "frozen",
            3,
            -signal.SIGKILL,
            "monitor",
        )
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_the_monitor_leaves_a_rank_within_its_timeout_alone(tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from gpuvigil.training.heartbeat import _FMT, _MAGIC

        (tmp_path / "local-0.hb").write_bytes(
            _FMT.pack(_MAGIC, sleeper.pid, 0, 1, time.monotonic(), 30.0, 0.0, 0.0, -1)
        )
        cfg = TrainingConfig.load(environ={}, overrides={"monitor": {"poll_s": 0.05}})
        monitor = Monitor(cfg, tmp_path, node="n").start()
        time.sleep(0.5)
        monitor.stop()
        assert sleeper.poll() is None and monitor.named == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_launcher_keeps_a_workers_exit_code() -> None:
    from gpuvigil.training.launch import exit_code_of

    assert exit_code_of(exit_codes.DRAINED) == 89 and exit_code_of(-9) == 137


def test_sigterm_on_a_single_rank_stops_after_the_current_step() -> None:
    from gpuvigil.training.config import DrainConfig
    from gpuvigil.training.drain import Drain

    d = Drain(DrainConfig(), world_size=1, group=None)
    d.install()
    try:
        assert d.after_step(1, 0.1) is False
        os.kill(os.getpid(), signal.SIGTERM)  # the handler only raises a flag
        assert d.requested and d.after_step(2, 0.1) is True
    finally:
        d.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_restart_without_a_record_names_no_node(tmp_path: Path) -> None:
    """Rank 0 writes job.restart; with no exit record nothing names the failed node, and
    rank 0's own node (often the failed node's healthy peer) must not stand in for it."""
    import torch

    from gpuvigil.training.journal import Journal
    from gpuvigil.training.process_group import Env

    env = Env(rank=0, world_size=2, local_rank=0, node="healthy-peer",
              device=torch.device("cpu"), restart_count=1, round_key="attempt-1", job="j",
              config=TrainingConfig())  # fmt: skip
    j = Journal(env)
    j.open(tmp_path / "ev.jsonl")
    j.storage = LocalStorage(str(tmp_path / "ckpt"))
    j.started(nodes=["healthy-peer", "failed"], resumed_step=5, saved_ts=None)
    drained = lifecycle.ExitRecord(1.0, "drained", 1, "failed", 89, 5, "SIGTERM: drained")
    lifecycle.write_exit(j.storage, drained)
    j.started(nodes=["healthy-peer", "failed"], resumed_step=5, saved_ts=None)
    j.close()
    first, second = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert first["kind"] == "job.restart" and "node" not in first
    assert (second["node"], second["data"]["rank"]) == ("failed", 1)


def test_a_failed_job_end_names_the_drained_node_not_rank_0s(tmp_path: Path) -> None:
    """torchrun gave up on rank 0's node after the gang drained: job.end names the node
    the exit records blame (the drained one), with its rank and cause."""
    from gpuvigil.training import launch

    ckpt = tmp_path / "ckpt"
    infos = [{"rank": 0, "node": "healthy-peer", "job": "j", "checkpoint_dir": str(ckpt),
              "events_file": str(tmp_path / "ev.jsonl")},
             {"rank": 1, "node": "failed", "job": "j"}]  # fmt: skip

    class Mon:
        def ranks(self):  # type: ignore[no-untyped-def]
            return [(None, i) for i in infos]

    cfg = TrainingConfig()
    launch._end_event(Mon(), cfg, code=89, reason="DRAINED")  # type: ignore[arg-type]
    storage = LocalStorage(str(ckpt))
    lifecycle.write_exit(storage, lifecycle.ExitRecord(1.0, "drained", 1, "failed", 89, 5, "x"))
    lifecycle.write_exit(
        storage, lifecycle.ExitRecord(2.0, "drained", 0, "healthy-peer", 89, 5, "y")
    )
    launch._end_event(Mon(), cfg, code=89, reason="DRAINED")  # type: ignore[arg-type]
    unknown, named = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert "node" not in unknown  # two nodes and no record: nobody is named
    assert (named["node"], named["data"]["rank"], named["data"]["cause"]) == ("failed", 1, "drain")


def test_a_drain_keeps_the_others_only_while_each_drained_ranks_peer_stays() -> None:
    from gpuvigil.training.drain import peers_stay

    assert peers_stay([1], 3, 1)  # rank 1's copy is on rank 2
    assert not peers_stay([1, 2], 3, 1)  # rank 2 held it and leaves too
    assert peers_stay([0, 2], 4, 1) and not peers_stay([3, 0], 4, 1)
    # 2 nodes of 4 ranks: a node drained whole keeps the other node (peers are 4 away)
    assert peers_stay([0, 1, 2, 3], 8, 4) and not peers_stay([0, 4], 8, 4)
    assert not peers_stay([], 3, 1) and not peers_stay([0, 1, 2], 3, 1)


def test_a_single_rank_drain_names_itself_as_signalled() -> None:
    from gpuvigil.training.config import DrainConfig
    from gpuvigil.training.drain import Drain

    d = Drain(DrainConfig(), world_size=1, group=None)
    assert d.signalled() == []
    d = Drain(DrainConfig(), world_size=1, group=None)
    d.handle(signal.SIGTERM, None)
    assert d.signalled() == [0]


@pytest.mark.parametrize(
    ("rank", "in_process", "restart_count", "survivor", "writes"),
    [
        (0, False, 1, False, True),  # rank 0 always: its start is the gang's
        (1, False, 1, False, False),  # under torchrun every rank restarts: rank 0 speaks
        (1, True, 1, False, True),  # a lost rank's replacement: the restart's new process
        (1, True, 1, True, False),  # a survivor kept its process: no process start
        (1, True, 0, False, False),  # the job's first generation: rank 0 speaks
    ],
)
def test_the_startup_event_comes_from_rank_0_and_a_replacement(
    tmp_path: Path, rank: int, in_process: bool, restart_count: int, survivor: bool, writes: bool
) -> None:
    """The lab's restart phases time a process start from `startup`; in an in-process
    restart where rank 0 survived, the replacement's is the only new process."""
    import torch

    from gpuvigil.training.journal import Journal
    from gpuvigil.training.process_group import Env

    config = TrainingConfig(restart={"in_process": in_process})
    env = Env(rank=rank, world_size=2, local_rank=0, node="n", device=torch.device("cpu"),
              restart_count=restart_count, round_key="k", job="j", config=config,
              survivor=survivor)  # fmt: skip
    j = Journal(env)
    j.open(tmp_path / "ev.jsonl")
    j.ready(attempt=restart_count, step=3, first_step_s=0.1, init_ts=1.0, group_ts=2.0,
            restored_ts=3.0)  # fmt: skip
    j.close()
    lines = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["data"]["rank"]) for x in lines] == (
        [("startup", rank)] if writes else []
    )
