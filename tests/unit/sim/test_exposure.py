"""Honest exposure figures (issue #22, item 8) and the `lemon` scenario (item 7).

`broken_in_service_h`: node-hours a node with a fault that affects work was schedulable;
`max_quarantines_per_machine`, `lemons_replaced`, `max_flaps_in_service`: the machines'
memory, each per machine (a replacement is a new machine).
"""

from __future__ import annotations

from gpuvigil.sim.run import simulate


def test_broken_in_service_is_what_the_checks_take_away() -> None:
    """Without node checks a broken node takes work until someone notices (hours); with
    them it is taken out at its next check (seconds), so the exposure falls by far more
    than tenfold."""
    kw = {"nodes": 128, "days": 10, "seed": 1, "events": False}
    base, full = simulate("baseline", **kw), simulate("full", **kw)  # type: ignore[arg-type]
    assert base.broken_in_service_h > 10 * max(full.broken_in_service_h, 0.01)
    assert full.max_quarantines_per_machine >= 0 and full.lemons_replaced == 0


def test_lemon_is_replaced_done_when() -> None:
    """The issue's "Done when" (`gpuvigil simulate --nodes 512 --days 30 --seed 1 --json
    --scenario lemon`): the lemon is replaced, and quarantined at most twice first."""
    r = simulate("lemon", nodes=512, days=30, seed=1, events=False)
    assert r.lemons_replaced >= 1
    assert r.max_quarantines_per_machine <= 2
    assert r.max_flaps_in_service >= 1  # its Xid 79 came back at least once (the test can fail)
