"""The controller against real Slurm 22.05 (slurmctld + one slurmd per node + munge)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from ctl_helpers import CANNOT_RUN, FATAL, health, wait_for

from gpuvigil.platform.clusters.settings import SlurmSettings
from gpuvigil.platform.clusters.slurm import SlurmCluster, expand_hostlist
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import PolicyConfig, release
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State

pytestmark = pytest.mark.realparts


def adapter(slurm: Any, **kw: Any) -> SlurmCluster:
    return SlurmCluster(SlurmSettings(conf=str(slurm.conf), **kw))


def publish(slurm: Any, node: str, *findings: Any) -> None:
    slurm.run("scontrol", "update", f"NodeName={node}", f"Extra={health(*findings)}")


def controller(c: SlurmCluster, **policy: Any) -> Controller:
    cfg = ControllerConfig(
        cluster="slurm",
        policy=PolicyConfig(**{"fatal_grace_s": 0, **policy}),  # fatal: drain at once
        safety=SafetyConfig(max_disrupted=4, max_disrupted_percent=100),
    )
    return Controller(c, config=cfg)


def test_hostlists() -> None:
    assert expand_hostlist("gpu[1-3,05],cpu7") == ["gpu1", "gpu2", "gpu3", "gpu05", "cpu7"]
    assert expand_hostlist("") == []


def test_a_foreign_drain_is_never_resumed(slurm) -> None:  # type: ignore[no-untyped-def]
    c = adapter(slurm)
    slurm.run("scontrol", "update", "NodeName=gpu2", "State=DRAIN", "Reason=disk replacement")
    v = c.get_node("gpu2")
    assert not v.blocked_by_us and v.blocked_by_others == ("slurm:drain:disk replacement",)
    c.block("gpu2", reason="gpuvigil:SUSPECT:-:XID_79")
    c.unblock("gpu2")
    out = slurm.run("scontrol", "show", "node", "gpu2").stdout
    assert "Reason=disk replacement" in out and "DRAIN" in slurm.node_state("gpu2")
    for n in slurm.names:
        publish(slurm, n)
    publish(slurm, "gpu2", FATAL)
    ctl = controller(c)
    ctl.reconcile()
    assert c.get_node("gpu2").record is None  # left alone: a human owns it
    assert "Reason=disk replacement" in slurm.run("scontrol", "show", "node", "gpu2").stdout


def test_drain_requeue_reboot_and_restart_mid_drain(slurm) -> None:  # type: ignore[no-untyped-def]
    c = adapter(slurm)
    for n in slurm.names:
        publish(slurm, n)
    out = slurm.run(
        "sbatch", "--requeue", "--output=/dev/null", "-w", "gpu3", "--wrap", "sleep 600"
    ).stdout
    job = out.split()[-1]
    wait_for(lambda: c.get_node("gpu3").running == 1, 20, "job running on gpu3")
    publish(slurm, "gpu3", FATAL)
    ctl = controller(c, drain_timeout_s=4)
    ctl.reconcile()
    v = c.get_node("gpu3")
    assert v.record is not None and v.record.state is State.DRAINING
    assert v.blocked_by_us and "DRAIN" in slurm.node_state("gpu3")
    assert (
        "Reason=gpuvigil:DRAINING:-:XID_79" in slurm.run("scontrol", "show", "node", "gpu3").stdout
    )
    # The controller dies mid-drain; a new one (no memory) resumes from the node's record.
    del ctl
    time.sleep(4.5)
    ctl = controller(c, drain_timeout_s=4)
    ctl.reconcile()  # past the deadline: the job is requeued (infrastructure), node empty

    def requeued() -> bool:
        jobs = json.loads(slurm.run("squeue", "--json", "-j", job).stdout)["jobs"]
        return bool(jobs) and jobs[0]["job_state"] == "PENDING" and jobs[0]["restart_cnt"] >= 1

    wait_for(requeued, 30, "the job requeued (PENDING, restart count 1)")
    ctl.reconcile()
    v = c.get_node("gpu3")
    assert v.record is not None and v.record.state is State.REMEDIATING
    assert v.record.step is not None and v.record.issued == v.record.request_id
    state = slurm.node_state("gpu3")
    assert "REBOOT" in state and "DRAIN" in state
    # A restarted controller does not ask again.
    ctl = controller(c, drain_timeout_s=4)
    ctl.reconcile()
    assert c.calls["scontrol reboot"] == 1  # once, across both controllers
    # A human ends it: release -> VALIDATING; a fresh healthy summary -> HEALTHY, RESUMEd.
    slurm.run("scontrol", "update", "NodeName=gpu3", "State=RESUME")  # cancel the reboot
    slurm.run(
        "scontrol", "update", "NodeName=gpu3", "State=DRAIN", "Reason=gpuvigil:VALIDATING:-:-"
    )
    c.store("gpu3", release(c.get_node("gpu3").record, now=ctl.clock(), who="test"))
    publish(slurm, "gpu3")
    ctl.reconcile()
    wait_for(
        lambda: (
            slurm.node_state("gpu3").startswith("IDLE") and "DRAIN" not in slurm.node_state("gpu3")
        ),
        20,
        "gpu3 back in service",
    )
    assert c.get_node("gpu3").record.state is State.HEALTHY


def test_nodes_command_on_slurm(slurm, run_cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"controller:\n  cluster: slurm\n  slurm: {{conf: '{slurm.conf}'}}\n"
        "  policy: {fatal_grace_s: 0}\n"  # a fatal finding drains at once here
    )
    slurm.run("scontrol", "update", "NodeName=gpu1", "State=DRAIN", "Reason=bios update")
    out = run_cli("nodes", "--config", str(cfg), "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["node"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(rows) == set(slurm.names)
    assert rows["gpu1"]["blocked_by"] == ["slurm:drain:bios update"]
    assert rows["gpu2"]["state"] == "HEALTHY"


def test_controller_once_on_slurm(slurm, run_cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for n in slurm.names:
        publish(slurm, n)
    publish(slurm, "gpu4", FATAL)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"controller:\n  cluster: slurm\n  slurm: {{conf: '{slurm.conf}'}}\n"
        "  policy: {fatal_grace_s: 0}\n"  # a fatal finding drains at once here
    )
    out = run_cli("controller", "--config", str(cfg), "--once")
    assert out.returncode == 0, out.stderr
    assert "gpu4\tDRAINING" in out.stdout and "gpu1\tHEALTHY" in out.stdout
    assert "DRAIN" in slurm.node_state("gpu4")
    assert (
        "Reason=gpuvigil:DRAINING:-:XID_79" in slurm.run("scontrol", "show", "node", "gpu4").stdout
    )


def test_tool_breakage_lifts_gpuvigils_drains_and_keeps_foreign_ones(slurm) -> None:  # type: ignore[no-untyped-def]
    """One check fails closed on one node: drained (fail closed). It follows on two more:
    three of four nodes at once is no chance (the breaker's test), so it opens on that
    signature and resumes the nodes gpuvigil drained for it alone."""
    c = adapter(slurm)
    for n in slurm.names:
        publish(slurm, n)
    safety = SafetyConfig(max_disrupted=4, max_disrupted_percent=100)
    ctl = Controller(c, config=ControllerConfig(cluster="slurm", safety=safety))
    first, *rest = slurm.names[:3]
    publish(slurm, first, CANNOT_RUN)
    ctl.reconcile()
    assert not ctl.breaker.status.open
    assert "DRAIN" in slurm.node_state(first)
    for n in rest:
        publish(slurm, n, CANNOT_RUN)
    ctl.reconcile()
    assert ctl.breaker.status.causes == ["nvml/DEPENDENCY_MISSING@fleet"]
    for n in (first, *rest):
        assert "DRAIN" not in slurm.node_state(n), (n, slurm.node_state(n))
        assert c.get_node(n).record is None or c.get_node(n).record.state is State.HEALTHY
