"""Hot spares (`platform.spares`) through the real controller over the memory cluster: a
pool keeps its count of validated idle nodes, a used or failed spare is given back and
refilled, busy, unvalidated and unhealthy nodes are never taken, the rate and the breaker
hold new spares, and a config error names the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import FATAL
from prometheus_client import CollectorRegistry

from gpuvigil import config as config_mod
from gpuvigil.core.config import ConfigError
from gpuvigil.platform import metrics as pmetrics
from gpuvigil.platform.clusters.memory import MemoryCluster, Pod
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.spares import SpareConfig


def cfg(**spares: object) -> ControllerConfig:
    return ControllerConfig(
        policy=PolicyConfig(fatal_grace_s=0), spares=SpareConfig.model_validate(spares)
    )


def spares(c: MemoryCluster) -> list[str]:
    return sorted(n.name for n in c.nodes.values() if n.spare)


def test_a_pool_keeps_its_spares_and_refills_a_used_one() -> None:
    c = MemoryCluster()
    for i in range(6):
        c.add_node(f"a{i}", pool="a", pods=1 if i < 3 else 0)
    c.add_node("b0", pool="b")
    ctl = Controller(c, config=cfg(pools={"a": 2}), clock=c.clock.now)
    r = ctl.reconcile()
    assert spares(c) == ["a3", "a4"]  # idle ones only; pool b keeps none
    assert r.spares is not None and r.spares.spares == {"a": 2, "b": 0}
    # a gang job's lost rank lands on a3: it is that job's node now; a5 replaces it
    c.nodes["a3"].pods.append(Pod("job-rank-1"))
    c.nodes["a3"].version += 1
    ctl.reconcile()
    assert spares(c) == ["a4", "a5"]
    ctl.reconcile()  # nothing changes: no write
    assert c.calls["make_spare"] == 3 and c.calls["unmake_spare"] == 1


def test_never_a_busy_unvalidated_or_unhealthy_node() -> None:
    c = MemoryCluster()
    c.add_node("busy", pods=1)
    c.add_node("new", unvalidated=True)
    c.add_node("sick")
    c.set_findings("sick", [FATAL])
    c.add_node("cordoned")
    c.cordon("cordoned")
    c.add_node("fine")
    ctl = Controller(c, config=cfg(default=3), clock=c.clock.now)
    r = ctl.reconcile()
    assert spares(c) == ["fine"]
    assert r.spares is not None and r.spares.short("default") == 2


def test_a_spare_that_fails_is_given_back_and_replaced() -> None:
    c = MemoryCluster()
    for i in range(3):
        c.add_node(f"n{i}")
    ctl = Controller(c, config=cfg(default=1), clock=c.clock.now)
    ctl.reconcile()
    assert spares(c) == ["n0"]
    c.set_findings("n0", [FATAL])
    ctl.reconcile()
    assert spares(c) == ["n1"]


def test_work_that_lands_between_list_and_write_wins() -> None:
    c = MemoryCluster()
    c.add_node("n0")
    real = c.list_nodes

    def racing() -> list:  # type: ignore[type-arg]
        views = real()
        c.nodes["n0"].pods.append(Pod("raced"))
        return views

    c.list_nodes = racing  # type: ignore[method-assign]
    r = Controller(c, config=cfg(default=1), clock=c.clock.now).reconcile()
    assert spares(c) == [] and r.spares is not None and r.spares.spares == {"default": 0}


def test_rate_and_breaker_hold_new_spares_and_surplus_goes_back() -> None:
    c = MemoryCluster()
    for i in range(8):
        c.add_node(f"n{i}")
    ctl = Controller(c, config=cfg(default=5, max_new_per_pass=2), clock=c.clock.now)
    r = ctl.reconcile()
    assert len(spares(c)) == 2 and r.spares is not None and "rate" in r.spares.held
    ctl.reconcile()
    ctl.reconcile()
    assert len(spares(c)) == 5
    ctl.config = cfg(default=1)
    ctl.reconcile()
    assert spares(c) == ["n0"]  # the surplus went back to the queue


def test_breaker_open_holds_new_spares() -> None:
    c = MemoryCluster()
    for i in range(10):
        c.add_node(f"n{i}")
    for i in range(5):
        c.set_findings(f"n{i}", [FATAL])
    ctl = Controller(c, config=cfg(default=2), clock=c.clock.now)
    r = ctl.reconcile()
    assert r.breaker_open and spares(c) == []
    assert r.spares is not None and r.spares.held == "circuit breaker open"


def test_metrics_and_dry_run() -> None:
    c = MemoryCluster()
    c.add_node("n0")
    reg = CollectorRegistry()
    m = pmetrics.build(reg)
    dry = cfg(default=2).model_copy(update={"dry_run": True})
    Controller(c, config=dry, clock=c.clock.now, metrics=m).reconcile()
    assert spares(c) == [] and c.calls["make_spare"] == 0
    Controller(c, config=cfg(default=2), clock=c.clock.now, metrics=m).reconcile()
    assert reg.get_sample_value("gpuvigil_spares", {"pool": "default"}) == 1
    assert reg.get_sample_value("gpuvigil_spares_wanted", {"pool": "default"}) == 2


def test_a_bad_setting_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gpuvigil.yaml"
    path.write_text("controller:\n  spares:\n    pools: {train: -1}\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(path, sections=("controller",))
    assert "controller.spares.pools.train" in str(e.value) and str(path) in str(e.value)
    path.write_text("controller:\n  spares:\n    per_pool: 2\n")
    with pytest.raises(ConfigError) as e:
        config_mod.load(path, sections=("controller",))
    assert "controller.spares.per_pool" in str(e.value) and str(path) in str(e.value)


def test_gpuvigil_nodes_shows_the_spares(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuvigil.commands.nodes import node_row, render

    c = MemoryCluster()
    c.add_node("busy", pods=1)
    c.add_node("idle")
    Controller(c, config=cfg(default=1), clock=c.clock.now).reconcile()
    rows = [node_row(v) for v in sorted(c.list_nodes(), key=lambda v: v.name)]
    assert [(r["node"], r["spare"]) for r in rows] == [("busy", False), ("idle", True)]
    render(rows, ["1m", "1m"], history=False)
    out = capsys.readouterr().out
    assert out.count("(spare)") == 1  # the state cell: "HEALTHY (spare)"


def test_slurm_reservation_nodes_parse() -> None:
    from gpuvigil.platform.clusters.slurm_spares import reservation_nodes

    text = (
        "ReservationName=maint StartTime=now Nodes=gpu9 NodeCnt=1\n\n"
        "ReservationName=gpuvigil-spares StartTime=2026-12-03T11:36:50 EndTime=...\n"
        "   Nodes=gpu[2,4-5] NodeCnt=3 CoreCnt=6 Flags=FLEX,SPEC_NODES\n"
    )
    assert reservation_nodes(text, "gpuvigil-spares") == ["gpu2", "gpu4", "gpu5"]
    assert reservation_nodes("No reservations in the system\n", "gpuvigil-spares") is None
    assert reservation_nodes("garbage ReservationName=", "gpuvigil-spares") is None


class _FakeSlurm:
    """Just what `SlurmSpares` asks of `SlurmCluster`: `_run` records each scontrol call
    and answers `show reservation` from `resv` and `flags` (`Flags=X` adds X, `Flags-=X`
    takes it off, as Slurm 22.05 does: docs/slurm.md); a call starting with `fail` raises."""

    def __init__(self, resv: list[str], fail: tuple[str, ...] = ()) -> None:
        from gpuvigil.platform.clusters.settings import SlurmSettings

        self.settings = SlurmSettings(spare_users=["root"])
        self.resv, self.fail, self.writes = resv, fail, []  # type: ignore[var-annotated]
        self.flags = {"FLEX", "SPEC_NODES"}

    def _run(self, tool: str, *args: str) -> str:
        from gpuvigil.platform.clusters.base import Unavailable

        if args[:2] == ("show", "reservation"):
            flags = ",".join(sorted(self.flags))
            return (f"ReservationName=gpuvigil-spares Nodes={','.join(self.resv)} "
                    f"Flags={flags} State=ACTIVE")  # fmt: skip
        self.writes.append(" ".join(args))
        if self.fail and " ".join(args).startswith(self.fail):
            raise Unavailable("scontrol exited with status 1")
        for a in args:
            if a.startswith("Nodes="):
                self.resv = a[6:].split(",")
            elif a.startswith("Flags-="):
                self.flags -= set(a[7:].split(","))
            elif a.startswith("Flags="):
                self.flags |= set(a[6:].split(","))
        return ""

    def _jobs(self, name: str) -> list[object]:
        return []


GANG = {"job_id": 7, "job_state": "RUNNING", "nodes": "gpu[1-2]", "admin_comment": ""}


def test_slurm_gang_job_keeps_its_place_and_fails_closed() -> None:
    from gpuvigil.platform.clusters.slurm_spares import SlurmSpares, held_nodes, moved_survivors

    c = _FakeSlurm(["gpu4"])
    assert SlurmSpares(c).keep_place(GANG, "gpu1", [GANG]) is True  # type: ignore[arg-type]
    assert c.writes == ["update JobId=7 AdminComment=gpuvigil:spare-move:gpu2",
                        "update ReservationName=gpuvigil-spares Nodes=gpu2,gpu4 "
                        "Flags=IGNORE_JOBS"]  # fmt: skip
    # no move: a 1-node job, someone's AdminComment, no idle spare (gpu4 runs a job)
    one = {**GANG, "nodes": "gpu1"}
    noted = {**GANG, "admin_comment": "site note"}
    busy = {"job_id": 8, "job_state": "RUNNING", "nodes": "gpu4"}
    for job, jobs in ((one, [one]), (noted, [noted]), (GANG, [GANG, busy])):
        c = _FakeSlurm(["gpu4"])
        assert SlurmSpares(c).keep_place(job, "gpu1", jobs) is False  # type: ignore[arg-type]
        assert c.writes == []
    # the reservation refuses the survivor: the note is taken back, a plain requeue
    c = _FakeSlurm(["gpu4"], fail=("update ReservationName",))
    assert SlurmSpares(c).keep_place(GANG, "gpu1", [GANG]) is False  # type: ignore[arg-type]
    assert c.writes[-1] == "update JobId=7 AdminComment=" and c.resv == ["gpu4"]
    assert moved_survivors("gpuvigil:spare-move:gpu2,gpu3") == ["gpu2", "gpu3"]
    assert moved_survivors(None) is None and moved_survivors("x") is None
    assert held_nodes([{"admin_comment": "gpuvigil:spare-move:gpu2"}, {}]) == {"gpu2"}


def test_slurm_follow_points_the_pending_job_then_releases_its_survivor() -> None:
    from gpuvigil.platform.clusters.slurm_spares import SlurmSpares

    moving = {**GANG, "admin_comment": "gpuvigil:spare-move:gpu2", "nodes": ""}
    c = _FakeSlurm(["gpu2", "gpu4"])
    s = SlurmSpares(c)  # type: ignore[arg-type]
    assert s.follow([{**moving, "job_state": "COMPLETING"}]) == [] and c.writes == []
    s.follow([{**moving, "job_state": "PENDING"}])
    assert c.writes == ["update JobId=7 ReservationName=gpuvigil-spares StartTime=now"]
    c.writes.clear()
    assert s.follow([{**moving, "job_state": "PENDING", "resv_name": "gpuvigil-spares"}]) == []
    s.follow([{**moving, "job_state": "RUNNING", "nodes": "gpu[2,4]"}])
    assert c.resv == ["gpu4"] and c.writes[-1] == "update JobId=7 AdminComment="
    # pointing it fails: the survivor is given back at once (a plain requeued job)
    c = _FakeSlurm(["gpu2", "gpu4"], fail=("update JobId=7 ReservationName",))
    out = SlurmSpares(c).follow([{**moving, "job_state": "PENDING"}])  # type: ignore[arg-type]
    assert "move failed" in out[0] and c.resv == ["gpu4"]
    assert c.writes[-1] == "update JobId=7 AdminComment="


def test_slurm_ignore_jobs_comes_off_once_no_move_needs_it() -> None:
    """keep_place puts IGNORE_JOBS on the reservation (the survivors still run the job);
    Slurm keeps a flag until told otherwise, and with it would take any busy node into the
    reservation. It comes off with the last move's release, before the AdminComment is
    cleared: while another move holds survivors it stays, and a failed write is redone by
    the next pass, which still sees the AdminComment."""
    from gpuvigil.platform.clusters.slurm_spares import SlurmSpares, reservation_flags

    off = "update ReservationName=gpuvigil-spares Flags-=IGNORE_JOBS"
    b = {"job_id": 9, "job_state": "RUNNING", "nodes": "gpu[5-6]", "admin_comment": ""}
    c = _FakeSlurm(["gpu4", "gpu8"])
    s = SlurmSpares(c)  # type: ignore[arg-type]
    assert s.keep_place(GANG, "gpu1", [GANG, b]) and s.keep_place(b, "gpu5", [GANG, b])
    assert "IGNORE_JOBS" in c.flags and c.resv == ["gpu2", "gpu4", "gpu6", "gpu8"]
    a_moved = {**GANG, "admin_comment": "gpuvigil:spare-move:gpu2", "nodes": "gpu[2,4]"}
    b_waits = {**b, "admin_comment": "gpuvigil:spare-move:gpu6", "job_state": "PENDING",
               "resv_name": "gpuvigil-spares", "nodes": ""}  # fmt: skip
    c.writes.clear()
    s.follow([a_moved, b_waits])  # a runs; b's survivor gpu6 is still held: the flag stays
    assert c.writes == ["update ReservationName=gpuvigil-spares Nodes=gpu4,gpu6,gpu8",
                        "update JobId=7 AdminComment="]  # fmt: skip
    assert "IGNORE_JOBS" in c.flags
    a_done = {**a_moved, "admin_comment": ""}
    b_moved = {**b, "admin_comment": "gpuvigil:spare-move:gpu6", "nodes": "gpu[6,8]"}
    c.writes.clear()
    s.follow([a_done, b_moved])  # the last move: off, then the AdminComment
    assert c.writes == ["update ReservationName=gpuvigil-spares Nodes=gpu4,gpu8", off,
                        "update JobId=9 AdminComment="]  # fmt: skip
    assert c.flags == {"FLEX", "SPEC_NODES"} and c.resv == ["gpu4", "gpu8"]
    # taking it off fails: the AdminComment stays, and the next pass takes it off
    c = _FakeSlurm(["gpu2", "gpu4"], fail=(off,))
    c.flags.add("IGNORE_JOBS")
    s = SlurmSpares(c)  # type: ignore[arg-type]
    s.follow([a_moved])
    assert "IGNORE_JOBS" in c.flags and "update JobId=7 AdminComment=" not in c.writes
    c.fail = ()
    s.follow([a_moved])
    assert c.writes[-2:] == [off, "update JobId=7 AdminComment="]
    assert "IGNORE_JOBS" not in c.flags and c.resv == ["gpu4"]
    text = "ReservationName=r Nodes=gpu1 Flags=FLEX,IGNORE_JOBS State=INACTIVE"
    assert reservation_flags(text, "r") == {"FLEX", "IGNORE_JOBS"}  # an ended one too
    assert reservation_flags(text, "other") == set() == reservation_flags("", "r")
