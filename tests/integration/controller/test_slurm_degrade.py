"""A degraded node on real Slurm 22.05: one GPU out, seven at work, eight after the repair.

Its own 2-node cluster (the session one is shared, and these tests rewrite gres.conf and
restart slurmctld): the NodeName lines in an Included `nodes.conf`, gres.conf's one shared
line, and gpuvigil's TaskProlog.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ctl_helpers import health

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.io import slurm_conf as sc
from gpuvigil.platform.clusters.base import Forbidden, Unavailable
from gpuvigil.platform.clusters.settings import SlurmDegradeSettings, SlurmSettings
from gpuvigil.platform.clusters.slurm import SlurmCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.gpu_path import IsolationConfig
from gpuvigil.platform.isolation import decode_isolation
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State
from realparts import slurm as slurm_mod
from realparts.fixtures import _session

pytestmark = pytest.mark.realparts

UUID = "GPU-3a1b0c2d-0000-4000-8000-000000000003"


def _make(workdir: Path) -> slurm_mod.SlurmCluster:
    prolog = workdir / "taskprolog"
    prolog.write_text(
        f"#!/bin/sh\nexec {sys.executable} -m gpuvigil slurm-taskprolog "
        f"--gres-conf {workdir / 'gres.conf'}\n"
    )
    prolog.chmod(0o755)
    return slurm_mod.SlurmCluster(workdir, nodes=2, node_fragment=True, task_prolog=str(prolog))


@pytest.fixture(scope="module")
def site() -> Iterator[slurm_mod.SlurmCluster]:
    yield from _session(slurm_mod, _make)


def adapter(
    site: Any, *, bin_dir: str | None = None, timeout_s: float = 10, **kw: Any
) -> SlurmCluster:
    given = {"enforcement": "taskprolog", "restart_slurmctld": site.restart_argv(), **kw}
    degrade = SlurmDegradeSettings(enabled=True, node_conf=str(site.node_conf), **given)
    settings = SlurmSettings(
        conf=str(site.conf), timeout_s=timeout_s, bin_dir=bin_dir, degrade=degrade
    )
    return SlurmCluster(settings)


def show(site: Any, node: str) -> dict[str, str]:
    from gpuvigil.io.slurm_client import parse_show_node

    return parse_show_node(site.run("scontrol", "show", "node", node, "-o").stdout)


def until_done(step: Any, limit_s: float = 120) -> float:
    t0 = time.monotonic()
    while not step().done:
        assert time.monotonic() - t0 < limit_s, "degrade did not finish"
        time.sleep(0.5)
    return time.monotonic() - t0


def idle(site: Any, node: str) -> None:
    """Wait for IDLE: right after a slurmctld restart a resumed node reads
    IDLE+NOT_RESPONDING for ~2 s (measured) until slurmctld hears from its slurmd again."""
    t0 = time.monotonic()
    while site.node_state(node) != "IDLE":
        assert time.monotonic() - t0 < 30, site.node_state(node)
        time.sleep(0.3)


def srun(site: Any, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        "srun",
        "--immediate=20",
        *args,
        "sh",
        "-c",
        "echo CVD=$CUDA_VISIBLE_DEVICES on $SLURMD_NODENAME",
    ]
    return subprocess.run(argv, env=site.env(), capture_output=True, text=True, timeout=60)


def test_scontrol_refuses_a_gres_count_update(site) -> None:  # type: ignore[no-untyped-def]
    """Why the procedure rewrites files: slurmctld refuses `Gres=gpu:7` on File-bound GPUs."""
    r = site.run("scontrol", "update", "NodeName=gpu2", "Gres=gpu:7", check=False)
    assert r.returncode != 0 and "Invalid generic resource" in r.stderr
    assert show(site, "gpu2")["Gres"] == "gpu:8"


def test_degrade_runs_seven_then_restore_runs_eight(site, capsys) -> None:  # type: ignore[no-untyped-def]
    c = adapter(site)
    assert c.gpu_isolation_unavailable() is None  # TaskProlog named gpuvigil: verified
    gres0, nodes0 = (site.dir / "gres.conf").read_text(), site.node_conf.read_text()
    other = site.run(
        "sbatch", "-w", "gpu1", "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 300"
    )
    held = site.run(
        "sbatch", "-w", "gpu2", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 300"
    )
    held_id = held.stdout.split()[-1]
    while "gpu:2" not in site.run("scontrol", "show", "node", "gpu2", "-d").stdout:
        time.sleep(0.3)

    t0 = time.monotonic()
    p = c.isolate_gpu("gpu2", uuid=UUID, index=3, reason="XID_79")
    assert (p.step, p.gpu_jobs) == ("draining", 1)  # a job holds 2 GPUs: nothing rewritten
    assert show(site, "gpu2")["Reason"] == f"gpuvigil gpu {UUID} idx 3: XID_79"
    assert "DRAIN" in site.node_state("gpu2")
    assert (site.dir / "gres.conf").read_text() == gres0
    site.run("scancel", held_id)
    until_done(lambda: c.isolate_gpu("gpu2", uuid=UUID, index=3, reason="XID_79"))
    drain_to_seven = time.monotonic() - t0

    idle(site, "gpu2")
    assert show(site, "gpu2")["Gres"] == "gpu:7"
    assert c.calls["restart_slurmctld"] == 1  # reconfigure alone did not change the count
    assert "Gres=gpu:7" in site.node_conf.read_text()
    assert sc.node_gpu_files((site.dir / "gres.conf").read_text(), "gpu2")[3].endswith("nvidia4")
    # the job on the other node lived through the slurmctld restart
    assert other.stdout.split()[-1] in site.run("squeue", "-h", "-o", "%i", "-t", "R").stdout

    r = srun(site, "-w", "gpu2", "--gres=gpu:7")
    assert r.returncode == 0 and "CVD=0,1,2,4,5,6,7" in r.stdout, r.stdout + r.stderr
    r = srun(site, "-w", "gpu2", "--gres=gpu:8")
    assert r.returncode != 0  # 8 GPUs are no longer there
    site.run("scancel", other.stdout.split()[-1])
    for _ in range(3):  # an 8-GPU job goes where 8 GPUs are, never to the degraded node
        r = srun(site, "--gres=gpu:8")
        assert r.returncode == 0 and "on gpu1" in r.stdout, r.stdout + r.stderr
    again = c.isolate_gpu("gpu2", uuid=UUID, index=3, reason="XID_79")
    assert again.done and c.calls["restart_slurmctld"] == 1  # a repeat is a no-op

    t1 = time.monotonic()
    until_done(lambda: c.restore_gpu("gpu2", uuid=UUID, index=3))
    restore_s = time.monotonic() - t1
    assert c.calls["restart_slurmctld"] == 2  # 7 -> 8 needs the restart too (measured)
    idle(site, "gpu2")
    assert show(site, "gpu2")["Gres"] == "gpu:8"
    assert not sc.markers((site.dir / "gres.conf").read_text())
    assert sc.node_count(site.node_conf.read_text(), "gpu2") == 8
    assert site.node_conf.read_text() == nodes0
    r = srun(site, "-w", "gpu2", "--gres=gpu:8")
    assert r.returncode == 0 and "CVD=0,1,2,3,4,5,6,7" in r.stdout, r.stdout + r.stderr
    with capsys.disabled():
        print(f"\n[slurm degrade] drain->7-GPU resume {drain_to_seven:.1f} s (incl. the job's "
              f"end), restore->8 {restore_s:.1f} s")  # fmt: skip


def test_unwritable_gres_conf_leaves_the_node_drained(site) -> None:  # type: ignore[no-untyped-def]
    c = adapter(site)
    gres = site.dir / "gres.conf"
    subprocess.run(["chattr", "+i", str(gres)], check=True)
    try:
        with pytest.raises(Unavailable, match="cannot write"):
            c.isolate_gpu("gpu1", uuid=UUID, index=5, reason="ROW_REMAP_FAILURE")
        reason = show(site, "gpu1")["Reason"]
        assert reason.startswith(f"gpuvigil gpu {UUID} idx 5: degrade failed: cannot write")
        assert "DRAIN" in site.node_state("gpu1") and show(site, "gpu1")["Gres"] == "gpu:8"
    finally:
        subprocess.run(["chattr", "-i", str(gres)], check=True)
    # a later pass (or a restarted controller) finishes the job, and the repair undoes it
    until_done(lambda: c.isolate_gpu("gpu1", uuid=UUID, index=5, reason="ROW_REMAP_FAILURE"))
    assert show(site, "gpu1")["Gres"] == "gpu:7"
    until_done(lambda: c.restore_gpu("gpu1", uuid=UUID, index=5))
    idle(site, "gpu1")
    assert show(site, "gpu1")["Gres"] == "gpu:8"


def test_a_hanging_scontrol_fails_closed(site, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """scontrol answers reads but hangs on reconfigure: the node is left drained, files
    written, with a reason that says so; the next pass with a working scontrol finishes."""
    real = subprocess.run(["which", "scontrol"], capture_output=True, text=True).stdout.strip()
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("sinfo", "squeue"):
        (fake / tool).symlink_to(subprocess.run(["which", tool], capture_output=True,
                                                text=True).stdout.strip())  # fmt: skip
    (fake / "scontrol").write_text(
        f'#!/bin/sh\n[ "$1" = reconfigure ] && exec sleep 60\nexec {real} "$@"\n'
    )
    (fake / "scontrol").chmod(0o755)
    stuck = fake.parent / "stuck"
    stuck.mkdir()
    (stuck / "scontrol").write_text("#!/bin/sh\nexec sleep 60\n")
    (stuck / "scontrol").chmod(0o755)
    before = show(site, "gpu2")
    with pytest.raises(Unavailable, match="scontrol"):  # nothing readable: nothing done
        adapter(site, bin_dir=str(stuck), timeout_s=1).isolate_gpu(
            "gpu2", uuid=UUID, index=0, reason="XID_48"
        )
    assert show(site, "gpu2")["State"] == before["State"] and "Reason" not in show(site, "gpu2")
    hung = adapter(site, bin_dir=str(fake), timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(Unavailable):
        hung.isolate_gpu("gpu2", uuid=UUID, index=0, reason="XID_48")
    assert time.monotonic() - t0 < 15
    reason = show(site, "gpu2")["Reason"]
    assert reason.startswith(f"gpuvigil gpu {UUID} idx 0: degrade failed:"), reason
    assert "DRAIN" in site.node_state("gpu2")
    c = adapter(site)
    until_done(lambda: c.isolate_gpu("gpu2", uuid=UUID, index=0, reason="XID_48"))
    assert show(site, "gpu2")["Gres"] == "gpu:7"
    until_done(lambda: c.restore_gpu("gpu2", uuid=UUID, index=0))
    assert show(site, "gpu2")["Gres"] == "gpu:8"


def test_someone_elses_drain_and_unverifiable_enforcement_are_refused(site) -> None:  # type: ignore[no-untyped-def]
    c = adapter(site)
    site.run("scontrol", "update", "NodeName=gpu1", "State=DRAIN", "Reason=disk swap")
    try:
        with pytest.raises(Forbidden, match="someone else"):
            c.isolate_gpu("gpu1", uuid=UUID, index=1, reason="XID_79")
        assert show(site, "gpu1")["Reason"] == "disk swap"
    finally:
        site.run("scontrol", "update", "NodeName=gpu1", "State=RESUME")
    assert adapter(site, enforcement="cgroup").gpu_isolation_unavailable() == (
        "TaskPlugin is 'task/none', not task/cgroup"
    )


def test_the_controller_degrades_for_one_gpu_and_restores_after_the_repair(site, capsys) -> None:  # type: ignore[no-untyped-def]
    """XID_94 (GPU-local) on gpu2's GPU 3, a job holding 2 of its GPUs: the controller's GPU
    path drains gpu2 naming the GPU, requeues the job at the evict deadline, degrades the
    node to 7 and resumes it, without the node's ladder; a clean summary restores 8."""
    c = adapter(site)
    bad = FindingSummary(code="XID_94", component="gpu:3", status=Status.FAILED,
                         action=Action.RESET_GPU, check="xid", uuid=UUID)  # fmt: skip
    cfg = ControllerConfig(
        cluster="slurm",
        policy=PolicyConfig(fatal_grace_s=0, suspect_grace_s=0),
        safety=SafetyConfig(max_disrupted=2, max_disrupted_percent=100),
        isolation=IsolationConfig(evict_timeout_s=2),
    )
    ctl = Controller(c, config=cfg)
    job = site.run("sbatch", "--requeue", "-w", "gpu2", "--gres=gpu:2", "-o", "/dev/null",
                   "--wrap", "sleep 300").stdout.split()[-1]  # fmt: skip
    while "gpu:2" not in site.run("scontrol", "show", "node", "gpu2", "-d").stdout:
        time.sleep(0.3)

    def passes(findings: dict[str, tuple[FindingSummary, ...]], until: Any) -> float:
        t0 = time.monotonic()
        while True:
            for n in site.names:
                site.run(
                    "scontrol", "update", f"NodeName={n}", f"Extra={health(*findings.get(n, ()))}"
                )
            ctl.reconcile()
            v = c.get_node("gpu2")
            assert v.record is None or v.record.state is State.HEALTHY, v.record  # no ladder
            if until():
                return time.monotonic() - t0
            assert time.monotonic() - t0 < 120, show(site, "gpu2")
            time.sleep(0.5)

    def gpus(n: int) -> bool:
        return show(site, "gpu2")["Gres"] == f"gpu:{n}" and site.node_state("gpu2") == "IDLE"

    took = passes({"gpu2": (bad,)}, lambda: gpus(7))
    rec = decode_isolation(c.get_node("gpu2").isolation_text)
    assert rec is not None and (rec.scope, rec.step, rec.index) == ("slurm", "isolated", 3)
    state = site.run("squeue", "-h", "-j", job, "-o", "%T %N").stdout.split()
    assert state[:1] != ["RUNNING"] or state[1:] != ["gpu2"]  # requeued off the bad node
    site.run("scancel", job)
    r = srun(site, "-w", "gpu2", "--gres=gpu:7")
    assert r.returncode == 0 and "CVD=0,1,2,4,5,6,7" in r.stdout, r.stdout + r.stderr

    back = passes({}, lambda: gpus(8))  # the repair: the GPU's findings cleared
    assert c.get_node("gpu2").isolation_text is None
    assert not sc.markers((site.dir / "gres.conf").read_text())
    with capsys.disabled():
        print(f"\n[slurm controller] XID_94 -> 7-GPU resume {took:.1f} s (a 2 s evict "
              f"deadline included), clean -> 8 GPUs {back:.1f} s")  # fmt: skip


def test_device_cgroups_are_read_from_slurmctld(site) -> None:  # type: ignore[no-untyped-def]
    """`enforcement: cgroup` is verified in `scontrol show config`, which prints cgroup.conf
    only under TaskPlugin=task/cgroup (measured). slurmctld alone restarts with it; the
    slurmds keep task/none, and the configuration is put back afterwards."""
    text = site.conf.read_text()
    cgroup = site.dir / "cgroup.conf"
    try:
        cgroup.write_text("ConstrainDevices=yes\n")
        site.conf.write_text(text.replace("TaskPlugin=task/none", "TaskPlugin=task/cgroup"))
        subprocess.run(site.restart_argv(), check=True, timeout=60)
        c = adapter(site, enforcement="cgroup")
        t0 = time.monotonic()
        while True:
            try:
                assert c.gpu_isolation_unavailable() is None
                break
            except Unavailable:  # slurmctld still starting
                assert time.monotonic() - t0 < 30
                time.sleep(0.5)
    finally:
        site.conf.write_text(text)
        cgroup.unlink(missing_ok=True)
        subprocess.run(site.restart_argv(), check=True, timeout=60)
        idle(site, "gpu1")
