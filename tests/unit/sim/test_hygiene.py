"""The simulator's own hygiene (issue #22, item 9): a pass follows a breaker probe's end, no
restart reports negative lost work, one ladder."""

from __future__ import annotations

import pytest

from gpuvigil.platform import state
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.sim import lifecycle, platform, replay
from gpuvigil.sim.faults import Storm
from gpuvigil.sim.record import EventRecorder
from gpuvigil.sim.run import simulate


def test_one_ladder() -> None:
    assert lifecycle.LADDER is state.LADDER and replay.LADDER is state.LADDER
    assert not hasattr(platform, "LADDER")


def test_the_next_probe_starts_on_time_after_one_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad driver that stays 30 h: the breaker's probes repair a node that stays bad.
    Each probe's end must be followed by the next probe `breaker_probe_interval_s` later,
    not at the next news: a pass is scheduled when a probe ends (before the fix, the
    probe's quarantined node waited 5.0 h for a pass)."""
    log: list[tuple[float, dict[object, str]]] = []
    real = platform.Platform.reconcile

    def watched(self: platform.Platform) -> platform.Wake:
        wake = real(self)
        sigs = self.controller.breaker.signatures
        log.append((self.t, {sid: s.probe for sid, s in sigs.items()}))
        return wake

    monkeypatch.setattr(platform.Platform, "reconcile", watched)
    storm = Storm(at_s=3600.0, fixed_after_s=30 * 3600.0, kind="driver")
    simulate("driver-storm+breaker", nodes=128, days=2, seed=1, events=False, storm=storm)
    interval = SafetyConfig().breaker_probe_interval_s
    waits, ended = [], None
    for (t, probes), (_, before) in zip(log[1:], log, strict=False):
        for sid, probe in probes.items():
            if before.get(sid) and not probe:
                ended = t
            elif probe and not before.get(sid) and ended is not None:
                waits.append(t - ended)
                ended = None
    assert len(waits) >= 3, "fewer than 3 probes followed one another: the test saw nothing"
    assert max(waits) <= interval + 120.0, waits


def test_no_restart_reports_negative_lost_work() -> None:
    rec = EventRecorder()
    simulate("full", nodes=256, days=20, seed=1, recorder=rec)  # 4 were negative
    lost = [e.data["lost_s"] for e in rec.events if e.kind == "job.restart"]
    assert lost and min(lost) >= 0.0
    drained = [e.data["lost_s"] for e in rec.events
               if e.kind == "job.restart" and e.data.get("exit_code") == 89]  # fmt: skip
    assert all(x == 0.0 for x in drained)
