"""Issue #22 item 6: replacements that arrive faulty. The fault is one of the fleet's own
hardware faults; only the code keeps it from work (the real preflight verdict and the
controller's ladder), so its cost shows in repairs and availability, never as exposure."""

from __future__ import annotations

from gpuvigil.sim.run import simulate
from gpuvigil.sim.scenarios import SimConfig


def test_a_replacement_that_arrives_broken_is_caught_before_it_takes_work() -> None:
    kw = {"nodes": 512, "days": 30, "seed": 1, "events": False}
    clean = simulate("full", config=SimConfig(replacement_faulty_rate=0.0), **kw)
    broken = simulate("full", config=SimConfig(replacement_faulty_rate=1.0), **kw)
    assert clean.faulty_replacements == 0
    assert broken.faulty_replacements >= 10  # every replacement of the run (17 at seed 1)
    # what they cost: the repairs to make them good, and the time they are out doing it
    assert broken.remediations > clean.remediations
    assert broken.node_availability < clean.node_availability
    # never what a broken machine in service costs: preflight's real verdict catches them
    assert broken.broken_in_service_h <= clean.broken_in_service_h + 0.01
    assert broken.healthy_replaced == 0 and broken.false_quarantines == 0


def test_the_default_is_no_faulty_replacement() -> None:
    assert SimConfig().replacement_faulty_rate == 0.0
