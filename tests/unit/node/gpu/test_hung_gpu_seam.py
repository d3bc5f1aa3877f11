"""One hung GPU hides nothing, across the seam to the platform (issue #12 item 5, node side):
GPU 2 hangs in the driver and GPU 5 has an uncorrectable ECC error. The real `gpu` check
(fake NVML through the real worker process) reports both, each on its own GPU; the agent's
real summary of that report, read by the platform's real `decide()` and by the real
controller on the in-memory cluster, starts the reset of GPU 5."""

from __future__ import annotations

from typing import Any

from gpuvigil.core import wire
from gpuvigil.core.findings import Action, NodeReport, Status
from gpuvigil.fakes import faults
from gpuvigil.fakes.faults import Fault
from gpuvigil.node.checks import REGISTRY, run_check
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.policy import decide
from gpuvigil.platform.state import State


def hung_and_ecc_report(scenario, make_ctx) -> NodeReport:  # type: ignore[no-untyped-def]
    node, path = scenario
    node.gpus[2].hang = True
    faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=5)
    node.save(path)
    findings, run = run_check(REGISTRY["gpu"], make_ctx(nvml_timeout_s=1.5))
    return NodeReport(node="n1", findings=tuple(findings), checks=(run,))


def test_the_ecc_reset_starts_though_another_gpu_hung(scenario, make_ctx) -> None:  # type: ignore[no-untyped-def]
    report = hung_and_ecc_report(scenario, make_ctx)
    summary = wire.decode_health(wire.summarize(report).model_dump_json())  # what the agent writes
    assert summary is not None
    got = {(f.code, f.component) for f in summary.findings}
    assert {("CHECK_TIMEOUT", "gpu:2"), ("ECC_UNCORRECTED_VOLATILE", "gpu:5")} <= got

    cluster = MemoryCluster()
    for i in range(4):
        cluster.add_node(f"n{i}")
    cluster.set_findings("n1", summary.findings, fixed_by=None)

    # The policy alone, over the node as the controller sees it: the ECC error takes
    # the node out of service (blocked, then drained for a repair once it persists).
    first = decide(cluster.get_node("n1"), now=cluster.clock.now())
    assert first.record.state in (State.SUSPECT, State.DRAINING), first
    assert "ECC_UNCORRECTED_VOLATILE gpu:5" in first.record.reason

    # The real controller, pass by pass: the step it asks the agent for is a GPU reset,
    # of the GPU the ECC error is on.
    asked: list[tuple[Action, list[int]]] = []
    request = cluster.request

    def spy(name: str, **kw: Any) -> None:
        asked.append((kw["action"], list(kw["gpus"])))
        request(name, **kw)

    cluster.request = spy  # type: ignore[method-assign]
    ctl = Controller(cluster, config=ControllerConfig(), clock=cluster.clock.now)
    for _ in range(40):  # virtual time: the suspect grace (600 s) passes, then the drain
        ctl.reconcile()
        if asked:
            break
        cluster.advance(60)
    assert asked and asked[0][0] is Action.RESET_GPU, asked
    assert 5 in asked[0][1], asked
    assert all(f.status is Status.FAILED for f in summary.findings if f.component == "gpu:2")
