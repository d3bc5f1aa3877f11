"""`gpuvigil npd-plugin` (node-problem-detector's custom-plugin protocol) on the fake node,
and `gpuvigil slurm-healthcheck` against a real Slurm node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from agent_helpers import fake_machine, machine_config

from gpuvigil.core.findings import Finding, NodeReport, Status
from gpuvigil.fakes.gpu import SCENARIO_ENV
from gpuvigil.node.sinks.slurm import parse_show_node
from gpuvigil.node.sinks.state_file import write_atomic


def setup(tmp_path: Path):
    m = fake_machine(tmp_path / "machine")
    cfg = tmp_path / "gpuvigil.yaml"
    cfg.write_text(yaml.safe_dump(machine_config(m)))
    return m, cfg, {SCENARIO_ENV: str(m.scenario)}


def test_npd_plugin_exit_codes_and_message_length(run_cli, tmp_path):
    m, cfg, env = setup(tmp_path)
    ok = run_cli("npd-plugin", "gpu", "fabric", "--config", str(cfg), env=env)
    assert (ok.returncode, ok.stdout.strip()) == (0, "gpuvigil: healthy"), ok.stderr
    m.sysfs.port_down("mlx5_1")
    bad = run_cli("npd-plugin", "fabric", "--config", str(cfg), env=env)
    assert bad.returncode == 1
    line = bad.stdout.rstrip("\n")
    assert line.startswith("FABRIC_PORT_DOWN") and len(line.encode()) <= 80
    # The fabric problem is not this condition's business.
    fam = run_cli("npd-plugin", "fabric", "--family", "GPUXidError", "--config", str(cfg), env=env)
    assert fam.returncode == 0
    # A check that cannot run is "unknown" (2), never OK.
    node = m.nvml()
    node.library_present = False
    m.save_nvml(node)
    unknown = run_cli(
        "npd-plugin",
        "gpu",
        "--config",
        str(cfg),
        "--max-length",
        "40",
        env={**env, "PATH": os.environ["PATH"]},
    )
    assert unknown.returncode == 2 and len(unknown.stdout.rstrip("\n").encode()) <= 40
    nosuch = run_cli("npd-plugin", "no_such_check", "--config", str(cfg), env=env)
    assert nosuch.returncode == 2 and "DEPENDENCY_MISSING" in nosuch.stdout


def test_npd_plugin_reads_a_fresh_agent_report_only(run_cli, tmp_path):
    state = tmp_path / "report.json"
    f = Finding(
        check="gpu",
        status=Status.FAILED,
        code="ECC_UNCORRECTED_VOLATILE",
        component="gpu:2",
        message="2 uncorrected",
    )
    write_atomic(state, NodeReport(node="n", findings=(f,)).model_dump_json().encode())
    p = run_cli("npd-plugin", "--from-state-file", str(state), "--family", "GPUMemoryError")
    assert p.returncode == 1 and p.stdout.startswith("ECC_UNCORRECTED_VOLATILE gpu:2")
    stale = run_cli("npd-plugin", "--from-state-file", str(state), "--max-age", "0")
    assert stale.returncode == 2


@pytest.mark.realparts
def test_slurm_healthcheck_drains_and_resumes_its_node(run_cli, slurm, tmp_path):
    cfg = tmp_path / "gpuvigil.yaml"
    cfg.write_text(
        yaml.safe_dump({"agent": {"sinks": {"slurm": {"marker_path": str(tmp_path / "marker")}}}})
    )
    state = tmp_path / "report.json"
    fatal = Finding(
        check="gpu",
        status=Status.FAILED,
        code="GPU_LOST",
        component="gpu:4",
        fatal=True,
        message="GPU 4 is lost",
    )
    write_atomic(state, NodeReport(node="gpu4", findings=(fatal,)).model_dump_json().encode())
    env = slurm.env()
    args = (
        "slurm-healthcheck",
        "--node-name",
        "gpu4",
        "--state-file",
        str(state),
        "--config",
        str(cfg),
    )
    p = run_cli(*args, env=env)
    assert p.returncode == 1, p.stdout + p.stderr
    info = parse_show_node(slurm.run("scontrol", "show", "node", "gpu4", "-o").stdout)
    assert "DRAIN" in info["State"] and info["Reason"] == "gpuvigil:SUSPECT:-:GPU_LOST gpu:4"
    write_atomic(state, NodeReport(node="gpu4").model_dump_json().encode())
    p = run_cli(*args, env=env)
    assert p.returncode == 0 and "resumed" in p.stdout, p.stdout + p.stderr
    info = parse_show_node(slurm.run("scontrol", "show", "node", "gpu4", "-o").stdout)
    assert "DRAIN" not in info["State"]


@pytest.mark.realparts
def test_slurm_healthcheck_drains_what_kubernetes_blocks_never_a_persons_drain(
    run_cli, slurm, tmp_path
):
    """Issue #21's example against a real slurmctld: uncorrectable ECC on fake GPU 5 is
    FAILED but not fatal. Kubernetes blocks new work on it (core.blocking), so Slurm drains
    it too; it resumes the node once the fault clears; a person's drain stays."""
    from gpuvigil.fakes import faults
    from gpuvigil.fakes.faults import Fault
    from gpuvigil.fakes.gpu import make_node

    m, cfg, env = setup(tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data["agent"]["sinks"] = {"slurm": {"marker_path": str(tmp_path / "marker")}}
    cfg.write_text(yaml.safe_dump(data))
    env = {**env, **slurm.env()}
    args = ("slurm-healthcheck", "--node-name", "gpu3", "--expect-gpus", "8", "--no-agent",
            "--config", str(cfg))  # fmt: skip

    def show() -> dict:
        return parse_show_node(slurm.run("scontrol", "show", "node", "gpu3", "-o").stdout)

    def fault(on: bool) -> None:
        node = make_node(8)
        if on:
            faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=5)
        m.save_nvml(node)

    try:
        fault(True)
        p = run_cli(*args, env=env)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "FAILED ECC_UNCORRECTED_VOLATILE gpu:5" in p.stdout, p.stdout
        assert "slurm: drained" in p.stdout, p.stdout
        info = show()
        assert "DRAIN" in info["State"], info
        assert info["Reason"].startswith("gpuvigil:SUSPECT:-:") and "gpu:5" in info["Reason"]
        fault(False)
        p = run_cli(*args, env=env)
        assert p.returncode == 0 and "slurm: resumed" in p.stdout, p.stdout + p.stderr
        assert "DRAIN" not in show()["State"]
        # a person drains it: gpuvigil never lifts that, fault or no fault
        slurm.run("scontrol", "update", "NodeName=gpu3", "State=DRAIN", "Reason=bios update")
        fault(True)
        p = run_cli(*args, env=env)
        assert p.returncode == 1 and "already drained" in p.stdout, p.stdout
        fault(False)
        p = run_cli(*args, env=env)
        assert p.returncode == 0, p.stdout + p.stderr
        info = show()
        assert "DRAIN" in info["State"] and info["Reason"] == "bios update", info
    finally:
        slurm.run("scontrol", "update", "NodeName=gpu3", "State=RESUME", check=False)
