"""The controller's per-GPU path over the in-memory cluster (virtual time): the same loop as
on Kubernetes (tests/integration/controller/test_gpu_isolation.py), many passes cheaply."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform import metrics as pmetrics
from gpuvigil.platform.clusters.memory import MemoryCluster, Pod
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.isolation import decode_isolation
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.state import State

CFG = ControllerConfig(policy=PolicyConfig(fatal_grace_s=0, suspect_grace_s=0))


def bad(gpu: int = 3, code: str = "XID_48", action: Action = Action.RESET_GPU) -> FindingSummary:
    return FindingSummary(code=code, component=f"gpu:{gpu}", status=Status.FAILED, action=action,
                          fatal=True, check="xid", uuid=f"GPU-{gpu}")  # fmt: skip


def machine(
    *, fixed_by: Action | None = Action.RESET_GPU, registry: CollectorRegistry | None = None
) -> tuple[MemoryCluster, Controller]:
    c = MemoryCluster()
    node = c.add_node("n1", gpus=8)
    node.pods = [Pod("holder", gpu="GPU-3"), Pod("other", gpu="GPU-5"), Pod("cpu")]
    c.set_findings("n1", [bad()], fixed_by=fixed_by)
    c.mark_gpu("n1", 3)
    metrics = pmetrics.build(registry) if registry is not None else None
    return c, Controller(c, config=CFG, clock=c.clock.now, metrics=metrics)


def isolation(c: MemoryCluster):  # type: ignore[no-untyped-def]
    return decode_isolation(c.nodes["n1"].isolation_raw)


def test_cured_by_its_reset_without_the_node_leaving_service() -> None:
    reg = CollectorRegistry()
    c, ctl = machine(registry=reg)
    for _ in range(6):
        ctl.reconcile()
        assert not c.nodes["n1"].our_taints  # never blocked
        c.advance(15)
    assert [p.name for p in c.nodes["n1"].evicted] == ["holder"]
    assert isolation(c) is None and not c.nodes["n1"].faults
    ops = [op for op, _ in c.nodes["n1"].actions]
    assert ops.count("request") == 1 and "drain" not in ops
    rec = ctl.cluster.get_node("n1").record
    assert rec is not None and rec.state is State.HEALTHY
    assert rec.episodes[-1].outcome == "cured:RESET_GPU" and rec.episodes[-1].gpu == "GPU-3"
    # each step of the GPU's ladder counted, as the dashboard's remediation panel reads them
    for step in ("evicting", "resetting", "released"):
        n = reg.get_sample_value("gpuvigil_remediations_total",
                                 {"action": "ISOLATE_GPU", "result": step})  # fmt: skip
        assert n == 1, step


def test_a_second_bad_gpu_turns_the_whole_node_ladder_on() -> None:
    c, ctl = machine(fixed_by=None)  # nothing cures it
    for _ in range(4):
        ctl.reconcile()
        c.advance(40)
    assert isolation(c).step == "isolated" and not c.nodes["n1"].our_taints
    from gpuvigil.commands.nodes import node_row

    row = node_row(c.get_node("n1"))  # what `gpuvigil nodes --json` shows
    assert row["gpu_isolated"]["index"] == 3 and row["gpu_isolated"]["step"] == "isolated"
    assert row["state"] == "HEALTHY" and row["episodes"][-1]["gpu"] == "GPU-3"
    c.set_findings("n1", [bad(), bad(5)], fixed_by=None)
    r = ctl.reconcile()
    assert isolation(c) is None
    assert r.decisions["n1"].state in (State.SUSPECT, State.DRAINING)
    assert "unhealthy" in c.nodes["n1"].our_taints


def test_without_gpu_resources_or_a_plugin_that_disagrees_the_node_ladder_runs() -> None:
    c, ctl = machine()
    c.mark_gpu("n1", 3, out=False)  # allocatable full: the device plugin disagrees
    r = ctl.reconcile()
    assert isolation(c) is None and r.decisions["n1"].state is State.DRAINING
    assert c.calls["gpu_holders"] == 0
