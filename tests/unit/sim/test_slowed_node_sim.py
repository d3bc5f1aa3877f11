"""The simulator credits moving work off a throttled node only through the real policy
(`PolicyConfig.slowing_codes`): the same fleet, faults and seed with the rule switched off
keep the gang at the throttled node's speed until a person repairs it."""

from __future__ import annotations

import dataclasses

from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.sim.faults import DEFAULT_KINDS, FaultModel
from gpuvigil.sim.jobs import WORKLOADS
from gpuvigil.sim.run import simulate


def _ettr(slowing: list[str] | None) -> tuple[float, int]:
    hot = next(k for k in DEFAULT_KINDS if k.name == "thermal_slowdown")
    wl = dataclasses.replace(WORKLOADS["llama3"], nodes=68, single_job_days=6)
    policy = PolicyConfig() if slowing is None else PolicyConfig(slowing_codes=slowing)
    r = simulate("full", workload=wl, seed=2, events=False,
                 model=FaultModel(kinds=(hot,), scale=60.0),
                 controller=ControllerConfig(policy=policy))  # fmt: skip
    return r.ettr, r.false_drains


def test_a_throttled_node_s_work_moves_to_an_idle_node_and_the_gang_speeds_up() -> None:
    moved, false_moved = _ettr(None)
    stayed, _ = _ettr([])
    assert false_moved == 0
    # thermal_slowdown runs the gang at 0.85x until the person's repair (hours)
    assert moved > stayed + 0.02, (moved, stayed)
