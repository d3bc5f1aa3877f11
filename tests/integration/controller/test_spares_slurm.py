"""What real Slurm 22.05 does to a gang job whose node fails, with a spare node kept in a
reservation (docs/slurm.md, "Hot spares"), and the controller keeping that
reservation. Four nodes: a 2-node gang job (`--requeue`), an ordinary job, an ordinary job
waiting, and gpu4 in the reservation `spares` (Flags=FLEX, Users=root).

- Plain requeue gives the slot away: the requeued gang job is held (Reason BeginTime) and
  the waiting ordinary job takes the surviving node at once; the spare, reserved, is never
  given to ordinary work.
- Pointing the requeued job at the reservation with `StartTime=now` (what a controller
  would do) ends the hold and lets it run on the spare plus a free node; the backfill
  scheduler starts it (bf_interval, 30 s by default), not the main one.
- The controller does that itself (`clusters.slurm_spares`): the survivor kept in the
  reservation across the requeue, the job pointed at it once PENDING, the survivor taken
  out once it runs; with both nodes idle the main scheduler starts it within seconds.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

pytestmark = pytest.mark.realparts


def job(slurm: Any, jid: str) -> dict[str, str]:
    out = slurm.run("scontrol", "show", "job", jid).stdout
    return dict(t.split("=", 1) for t in out.split() if "=" in t)


def until(cond: Any, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


def hostnames(slurm: Any, nodelist: str) -> list[str]:
    """Slurm's own expansion of a node list ("gpu[2,4]" -> gpu2, gpu4)."""
    return str(slurm.run("scontrol", "show", "hostnames", nodelist).stdout).split()


def sbatch(slurm: Any, *args: str) -> str:
    argv = ("sbatch", "--parsable", "--exclusive", *args, "--wrap", "sleep 600")
    return str(slurm.run(*argv).stdout.strip())


@pytest.fixture
def spares(slurm: Any) -> Any:
    slurm.run("scontrol", "create", "reservation", "ReservationName=spares", "Nodes=gpu4",
              "StartTime=now", "Duration=infinite", "Users=root", "Flags=FLEX")  # fmt: skip
    yield slurm
    slurm.run("scancel", "--full", "--quiet", "--user=root", check=False)
    slurm.run("scontrol", "delete", "ReservationName=spares", check=False)


def test_a_requeued_gang_job_loses_its_survivor_unless_sent_to_the_spare(spares: Any) -> None:
    slurm = spares
    gang = sbatch(slurm, "-N2", "--requeue")
    until(lambda: job(slurm, gang)["JobState"] == "RUNNING", 30)
    other = sbatch(slurm, "-N1")
    until(lambda: job(slurm, other)["JobState"] == "RUNNING", 30)
    waiting = sbatch(slurm, "-N1")
    time.sleep(1)
    assert job(slurm, waiting)["JobState"] == "PENDING"  # only the reserved spare is idle
    victim, survivor = slurm.run("scontrol", "show", "hostnames",
                                 job(slurm, gang)["NodeList"]).stdout.split()  # fmt: skip
    # gpuvigil's drain at its deadline: the node DRAINs, the batch job is requeued
    t0 = time.monotonic()
    slurm.run("scontrol", "update", f"NodeName={victim}", "State=DRAIN", "Reason=gpuvigil:t")
    slurm.run("scontrol", "requeue", gang)
    until(lambda: job(slurm, gang)["JobState"] == "PENDING", 30)
    held = job(slurm, gang)
    assert held["Reason"] == "BeginTime", held  # requeued batch jobs wait (~2 min measured)
    until(lambda: job(slurm, waiting)["JobState"] == "RUNNING", 30)
    took = job(slurm, waiting)["NodeList"]
    print(f"\nthe waiting ordinary job took {took} (the gang's survivor was {survivor})")
    assert took == survivor  # the slot went back to the queue
    assert "gpu4" not in took  # the spare stays out of ordinary work

    # Send the requeued job to the spare: eligible now, the spare plus a node that frees.
    slurm.run("scontrol", "update", f"JobId={gang}", "ReservationName=spares", "StartTime=now")
    slurm.run("scancel", other)  # a node frees (the survivor is the other job's now)
    ran = until(lambda: job(slurm, gang)["JobState"] == "RUNNING", 90)
    nodes = job(slurm, gang)["NodeList"]
    print(f"requeued job sent to the spare: running on {nodes} {ran:.1f} s later "
          f"({time.monotonic() - t0:.1f} s after the drain)")  # fmt: skip
    assert "gpu4" in slurm.run("scontrol", "show", "hostnames", nodes).stdout
    assert job(slurm, gang)["Restarts"] == "1"


def test_the_controller_keeps_a_spare_in_its_reservation(slurm: Any) -> None:
    from ctl_helpers import health

    from gpuvigil.platform.clusters.settings import SlurmSettings
    from gpuvigil.platform.clusters.slurm import SlurmCluster
    from gpuvigil.platform.controller import Controller, ControllerConfig
    from gpuvigil.platform.policy import PolicyConfig
    from gpuvigil.platform.spares import SpareConfig

    for n in slurm.names:  # every agent reports fit
        slurm.run("scontrol", "update", f"NodeName={n}", f"Extra={health()}")
    busy = sbatch(slurm, "-N1", "-w", "gpu1")
    until(lambda: job(slurm, busy)["JobState"] == "RUNNING", 30)
    adapter = SlurmCluster(SlurmSettings(conf=str(slurm.conf), spare_users=["root"]))
    config = ControllerConfig(cluster="slurm", leader_election=False,
                              policy=PolicyConfig(fatal_grace_s=0),
                              spares=SpareConfig(default=1))  # fmt: skip
    try:
        r = Controller(adapter, config=config).reconcile()
        assert r.spares is not None and r.spares.spares == {"gpu": 1}, r.spares
        got = adapter.spares.nodes()
        assert got is not None and len(got) == 1 and got != ["gpu1"]  # gpu1 holds work
        spare = got[0]
        # ordinary work never starts on it: with the two others taken, a job waits
        jobs = [sbatch(slurm, "-N1") for _ in range(3)]
        time.sleep(3)
        where = {job(slurm, j)["NodeList"] for j in jobs}
        assert spare not in where and job(slurm, jobs[2])["JobState"] == "PENDING", where
        # a gang job that may use the spares lands there; the used spare is given back
        gang = sbatch(slurm, "-N1", "--reservation=gpuvigil-spares")
        until(lambda: job(slurm, gang)["JobState"] == "RUNNING", 60)
        assert job(slurm, gang)["NodeList"] == spare
        r = Controller(adapter, config=config).reconcile()
        assert r.spares is not None and r.spares.spares == {"gpu": 0}, r.errors
        # the last node left: it ends (Slurm marks it INACTIVE within a few seconds)
        until(lambda: adapter.spares.nodes() is None, 10)
        assert job(slurm, gang)["JobState"] == "RUNNING"  # leaving it moved nothing
        # a node frees: it is the new spare (the ended reservation renewed)
        slurm.run("scancel", busy, *jobs)  # (a waiting one would take gpu1 at once)
        until(lambda: not adapter._jobs("gpu1"), 30)
        r = Controller(adapter, config=config).reconcile()
        assert r.spares is not None and r.spares.spares == {"gpu": 1}, r.errors
        assert adapter.spares.nodes() == ["gpu1"]
    finally:
        slurm.run("scancel", "--full", "--quiet", "--user=root", check=False)
        slurm.run("scontrol", "delete", "ReservationName=gpuvigil-spares", check=False)


def test_the_controller_moves_a_requeued_gang_job_onto_its_survivor_and_a_spare(
    slurm: Any,
) -> None:
    """The recipe above, done by the controller (`clusters.slurm_spares.keep_place` at the
    drain, `follow` on the next passes): one node of a 2-node gang job fails; the job runs again
    on its survivor plus the spare, and the waiting ordinary job never gets the survivor."""
    from ctl_helpers import FATAL, health

    from gpuvigil.platform.clusters.settings import SlurmSettings
    from gpuvigil.platform.clusters.slurm import SlurmCluster
    from gpuvigil.platform.controller import Controller, ControllerConfig
    from gpuvigil.platform.policy import PolicyConfig
    from gpuvigil.platform.safety import SafetyConfig
    from gpuvigil.platform.spares import SpareConfig

    for n in slurm.names:
        slurm.run("scontrol", "update", f"NodeName={n}", f"Extra={health()}")
    gang = sbatch(slurm, "-N2", "--requeue", "-o", "/dev/null")  # no -w: that binds it
    until(lambda: job(slurm, gang)["JobState"] == "RUNNING", 30)
    other = sbatch(slurm, "-N1", "-o", "/dev/null")
    until(lambda: job(slurm, other)["JobState"] == "RUNNING", 30)
    # where Slurm put them is its choice (it differs between runs): read it
    failed, survivor = hostnames(slurm, job(slurm, gang)["NodeList"])
    (idle,) = set(slurm.names) - {failed, survivor, job(slurm, other)["NodeList"]}
    adapter = SlurmCluster(SlurmSettings(conf=str(slurm.conf), spare_users=["root"],
                                         requeue_at_once=True))  # fmt: skip
    config = ControllerConfig(
        cluster="slurm", leader_election=False, policy=PolicyConfig(fatal_grace_s=0),
        safety=SafetyConfig(max_disrupted=4, max_disrupted_percent=100),
        spares=SpareConfig(default=1),
    )  # fmt: skip
    ctl = Controller(adapter, config=config)
    try:
        # the previous test's jobs may still be completing there (scancel --full): a node
        # that still holds a job is no spare, and the first pass would make none
        until(lambda: not adapter._jobs(idle), 30)
        ctl.reconcile()
        assert adapter.spares.nodes() == [idle]  # the one idle node
        waiting = sbatch(slurm, "-N1", "-o", "/dev/null")
        time.sleep(1)
        assert job(slurm, waiting)["JobState"] == "PENDING"
        slurm.run("scontrol", "update", f"NodeName={failed}", f"Extra={health(FATAL)}")
        t0 = time.monotonic()
        r = ctl.reconcile()  # drain the failed node: the survivor into the reservation, requeue
        assert not r.errors, r.errors
        assert sorted(adapter.spares.nodes() or []) == sorted([survivor, idle])
        assert job(slurm, gang)["AdminComment"] == f"gpuvigil:spare-move:{survivor}"
        seen: set[str] = set()

        def running() -> bool:
            r = ctl.reconcile()  # a pass a second: points the PENDING job at the spares
            assert not r.errors, r.errors
            seen.add(job(slurm, waiting)["NodeList"])
            return job(slurm, gang)["JobState"] == "RUNNING"

        try:
            ran = until(running, 80)
        except AssertionError:
            print(
                slurm.run("scontrol", "show", "job", gang).stdout,
                slurm.run("scontrol", "show", "reservation").stdout,
                slurm.run("sinfo").stdout,
                slurm.run("squeue").stdout,
            )
            raise
        nodes = job(slurm, gang)["NodeList"]
        print(f"\nthe gang job ran again on {nodes} {ran:.1f} s after the drain "
              f"({time.monotonic() - t0:.1f} s with the pass that saw it)")  # fmt: skip
        assert set(hostnames(slurm, nodes)) == {survivor, idle}, nodes
        assert job(slurm, gang)["Restarts"] == "1"
        assert survivor not in seen and job(slurm, waiting)["JobState"] == "PENDING", seen
        ctl.reconcile()  # it runs: the survivor leaves the reservation (and the used spare)
        assert survivor not in (adapter.spares.nodes() or [])
        assert job(slurm, gang)["AdminComment"] == ""
        assert job(slurm, gang)["JobState"] == "RUNNING"
        # the move is over: Slurm would keep IGNORE_JOBS (and take busy nodes in with it)
        resv = slurm.run("scontrol", "show", "reservation", "gpuvigil-spares").stdout
        assert "IGNORE_JOBS" not in resv, resv
    finally:
        slurm.run("scancel", "--full", "--quiet", "--user=root", check=False)
        slurm.run("scontrol", "delete", "ReservationName=gpuvigil-spares", check=False)
