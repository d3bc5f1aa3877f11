"""The simulator's own hygiene (issue #22, item 9): a pass follows a breaker probe's end, no
restart reports negative lost work, one ladder."""

from __future__ import annotations

import pytest

from gpuvigil.platform import state
from gpuvigil.platform.state import State
from gpuvigil.sim import lifecycle, platform, replay
from gpuvigil.sim.faults import Storm
from gpuvigil.sim.record import EventRecorder
from gpuvigil.sim.run import simulate


def test_one_ladder() -> None:
    assert lifecycle.LADDER is state.LADDER and replay.LADDER is state.LADDER
    assert not hasattr(platform, "LADDER")


def test_a_pass_follows_the_end_of_a_breaker_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad driver that stays 30 h: the breaker's probes reboot a node that stays bad, and
    the policy quarantines it. The breaker ends the probe at its next look; that look must
    come at once, not at the next news (before: 5.0 h later)."""
    log: list[tuple[float, set[str], set[str]]] = []
    real = platform.Platform.reconcile

    def watched(self: platform.Platform) -> platform.Wake:
        wake = real(self)
        probes = {s.probe for s in self.controller.breaker.signatures.values() if s.probe}
        quarantined = {n for n, st in wake.states.items() if st is State.QUARANTINED}
        log.append((self.t, probes, quarantined))
        return wake

    monkeypatch.setattr(platform.Platform, "reconcile", watched)
    storm = Storm(at_s=3600.0, fixed_after_s=30 * 3600.0, kind="driver")
    simulate("driver-storm+breaker", nodes=128, days=2, seed=1, events=False, storm=storm)
    gaps = [log[i + 1][0] - t for i, (t, probes, q) in enumerate(log[:-1]) if probes & q]
    assert gaps, "no probe ended in quarantine: the test saw nothing"
    assert max(gaps) < 1.0


def test_no_restart_reports_negative_lost_work() -> None:
    rec = EventRecorder()
    simulate("full", nodes=256, days=20, seed=1, recorder=rec)  # 4 were negative
    lost = [e.data["lost_s"] for e in rec.events if e.kind == "job.restart"]
    assert lost and min(lost) >= 0.0
    drained = [e.data["lost_s"] for e in rec.events
               if e.kind == "job.restart" and e.data.get("exit_code") == 89]  # fmt: skip
    assert all(x == 0.0 for x in drained)
