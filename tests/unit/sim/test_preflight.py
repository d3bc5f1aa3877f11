"""The simulated preflight is the real verdict over what the steps left on the machine
(`Episodes.preflight_passes`, `MemoryCluster.preflight_judge`), not "no published fault
remains": silent corruption no agent has reported fails it, a remaining fault no check
sees passes it, a missing tool fails it closed, as `gpuvigil preflight` would say."""

from __future__ import annotations

import pytest

from gpuvigil.core.findings import Action
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.clusters.memory import MemNode
from gpuvigil.platform.state import AgentResult
from gpuvigil.sim.engine import Engine
from gpuvigil.sim.faults import DEFAULT_KINDS, TOOL_MISSING, FaultKind, FaultModel
from gpuvigil.sim.fleet import FaultInstance
from gpuvigil.sim.jobs import WORKLOADS
from gpuvigil.sim.scenarios import SCENARIOS

KINDS = {k.name: k for k in (*DEFAULT_KINDS, TOOL_MISSING)}


@pytest.fixture
def engine() -> Engine:
    return Engine(scenario=SCENARIOS["full"], nodes=8, days=1.0, seed=1,
                  workload=WORKLOADS["mixed"], model=FaultModel(kinds=()))  # fmt: skip


def node_with(engine: Engine, kind: FaultKind, *, by: str = "", step: Action | None = None,
              fixed_by: Action | None = None) -> MemNode:  # fmt: skip
    """Node 0 carrying one fault (found `by` whom: "" for nobody yet), after `step` ran."""
    node = engine.fleet.nodes[0]
    fi = FaultInstance(1, kind, node.id, 0.0, gpu=3, detected_by=by, fixed_by=fixed_by)
    node.faults = [fi]
    mem = MemNode(node.name)  # the cluster's node: what it published, the step's answer
    if step is not None:
        mem.result = AgentResult("r1", succeeded=True, detail=step.value)
    return mem


def test_the_cluster_asks_the_engine(engine: Engine) -> None:
    assert engine.platform.cluster.preflight_judge == engine.preflight_passes


def test_a_clean_machine_passes(engine: Engine) -> None:
    mem = MemNode(engine.fleet.nodes[0].name)
    assert engine.preflight_passes(mem)


def test_unreported_silent_corruption_fails_it(engine: Engine) -> None:
    """The old rule passed it (nothing published): only a replacement cures SDC."""
    mem = node_with(engine, KINDS["sdc"], step=Action.REBOOT)
    assert not mem.faults
    assert not engine.preflight_passes(mem)


def test_a_published_fault_passes_once_the_cluster_cleared_it(engine: Engine) -> None:
    mem = node_with(engine, KINDS["gsp_error"], by="layer1", step=Action.RESET_GPU)
    assert engine.preflight_passes(mem)  # the reset was at least its cure step
    mem.faults = [FindingSummary(code="XID_119", status="FAILED", component="gpu:3",
                                 action="RESET_GPU", message="")]  # fmt: skip
    assert not engine.preflight_passes(mem)  # not cured: the node check sees Xid 119


@pytest.mark.parametrize(("step", "passes"), [(None, False), (Action.RESET_GPU, True)])
def test_an_unreported_fault_is_judged_by_its_own_cure(
    engine: Engine, step: Action | None, passes: bool
) -> None:
    mem = node_with(engine, KINDS["hbm_ecc"], step=step, fixed_by=Action.RESET_GPU)
    assert engine.preflight_passes(mem) is passes


def test_what_no_check_sees_passes_and_a_missing_tool_fails_closed(engine: Engine) -> None:
    assert engine.preflight_passes(node_with(engine, KINDS["host_failure"]))
    assert not engine.preflight_passes(node_with(engine, TOOL_MISSING, step=Action.REBOOT))
