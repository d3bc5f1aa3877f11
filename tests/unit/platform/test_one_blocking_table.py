"""Kubernetes and Slurm take a node out of new work on the same findings
(`core.blocking`): for every kind of finding, the controller's policy blocks the node
(SUSPECT or further, new work tainted away) exactly when Slurm's drain trigger drains it
(the standalone agent and `gpuvigil slurm-healthcheck`, default `drain_on`)."""

from __future__ import annotations

import pytest
from helpers import T0, finding, view

from gpuvigil.core.findings import Action, Finding, NodeReport, Status
from gpuvigil.node.sinks import slurm as sl
from gpuvigil.platform.policy import Fleet, PolicyConfig, decide

KINDS = [
    # the example: FAILED, not fatal, on GPU 5
    ("ECC_UNCORRECTED_VOLATILE", Status.FAILED, False, Action.RESET_GPU, "gpu:5"),
    ("ROW_REMAP_PENDING", Status.FAILED, False, Action.RESET_GPU, "gpu:5"),
    ("XID_79", Status.FAILED, True, Action.RESET_GPU, "gpu:3"),
    ("GPU_SDC", Status.FAILED, False, Action.INVESTIGATE, "gpu:1"),
    ("DEPENDENCY_MISSING", Status.FAILED, False, Action.NONE, "node"),  # could not run
    ("CHECK_TIMEOUT", Status.FAILED, False, Action.NONE, "node"),
    ("PCIE_LINK_DEGRADED", Status.WARNING, False, Action.NONE, "gpu:0"),
    ("XID_13", Status.WARNING, False, Action.NONE, "gpu:2"),
]


@pytest.mark.parametrize(("code", "status", "fatal", "action", "component"), KINDS)
def test_kubernetes_blocks_what_slurm_drains(code, status, fatal, action, component) -> None:  # type: ignore[no-untyped-def]
    summary = finding(code, status=status, fatal=fatal, action=action, component=component)
    d = decide(view(summary), fleet=Fleet(), now=T0, config=PolicyConfig())
    k8s_blocks = d.state.blocks
    report = NodeReport(node="n1", findings=(Finding(
        check=summary.check, status=status, code=code, component=component, fatal=fatal,
        action=action),))  # fmt: skip
    slurm_drains = sl.drain_trigger(report, drain_on="blocked") is not None
    assert k8s_blocks == slurm_drains, (code, status, k8s_blocks, slurm_drains)
    assert slurm_drains == (status is Status.FAILED)
    assert sl.SlurmConfig().drain_on == "blocked"  # the default is the shared table
    assert (sl.drain_trigger(report, drain_on="failed") is not None) == slurm_drains  # old name
    if not fatal:  # `fatal` narrows Slurm's drains, never widens them
        assert sl.drain_trigger(report, drain_on="fatal") is None
