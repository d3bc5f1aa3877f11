"""Leader election over the in-memory Lease, with virtual clocks per replica (each has its
own wall clock, skewed as the test likes, and its own monotonic clock). The real Lease and
real processes: tests/integration/controller/test_split_brain.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import T0
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.platform.clusters.base import Fenced
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.leader import LeaderElector, LeaseSettings


class World:
    """Real time `t`; each replica reads it through its own offsets."""

    def __init__(self) -> None:
        self.t = 0.0
        self.lease = MemoryCluster().lease_store()

    def elector(self, name: str, *, skew_s: float = 0.0, mono_offset: float = 0.0,
                **kw: float) -> LeaderElector:  # fmt: skip
        return LeaderElector(
            self.lease,
            identity=name,
            settings=LeaseSettings(**kw),
            wall=lambda: T0 + timedelta(seconds=self.t + skew_s),
            monotonic=lambda: self.t + mono_offset,
        )


def test_one_leader_and_takeover_after_a_whole_lease_unchanged() -> None:
    w = World()
    a, b = w.elector("a"), w.elector("b")
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    for _ in range(5):  # a renews every 2 s: b never sees the lease expire
        w.t += 2
        assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    seen = w.t  # b last saw a change now; a dies
    w.t = seen + 14.9
    assert not b.try_acquire_or_renew()
    w.t = seen + 15
    assert b.try_acquire_or_renew() and b.is_leader()
    assert w.lease.obj is not None and w.lease.obj.spec["leaseTransitions"] == 1
    assert not a.is_leader()  # a stepped down long ago (renew deadline)
    assert not a.try_acquire_or_renew()


@pytest.mark.parametrize("skew_s", [20.0, -20.0, 3600.0, -86400.0])
def test_wall_clock_skew_changes_nothing(skew_s: float) -> None:
    """The bug this replaced: expiry compared the holder's renewTime with the local clock,
    so a standby 20 s ahead saw a live lease as expired and both led."""
    w = World()
    a, b = w.elector("a"), w.elector("b", skew_s=skew_s, mono_offset=1e6)
    assert a.try_acquire_or_renew()
    for _ in range(20):
        w.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew() and not b.is_leader()
    seen = w.t
    w.t = seen + 15  # a dies: b takes over after a lease duration of its own clock
    assert b.try_acquire_or_renew()


def test_a_new_replica_waits_a_whole_lease_before_taking_an_old_one() -> None:
    w = World()
    a = w.elector("a")
    a.try_acquire_or_renew()
    w.t += 1000  # a died long ago, but b has only just started watching
    b = w.elector("b")
    assert not b.try_acquire_or_renew()
    w.t += 15
    assert b.try_acquire_or_renew()


def test_a_leader_that_cannot_renew_is_fenced_at_the_renew_deadline() -> None:
    w = World()
    a = w.elector("a")
    a.try_acquire_or_renew()
    w.t += 4
    assert a.fence() == pytest.approx(11.0)  # seconds before anyone could take over
    w.t += 5.9
    assert a.is_leader()
    w.t += 0.1
    with pytest.raises(Fenced):
        a.fence()
    assert not a.is_leader()


def test_release_hands_over_at_once() -> None:
    w = World()
    a, b = w.elector("a"), w.elector("b")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    assert b.try_acquire_or_renew()


def test_update_only_while_holding_and_it_renews() -> None:
    w = World()
    a, b = w.elector("a"), w.elector("b")
    a.try_acquire_or_renew()
    w.t += 9
    assert a.update(lambda ann: {**ann, "k": "1"})
    w.t += 9  # 18 s after the renewal, 9 s after the update: the update renewed
    assert a.is_leader()
    with pytest.raises(Fenced):
        b.update(lambda ann: {**ann, "k": "2"})
    assert w.lease.obj is not None and w.lease.obj.annotations == {"k": "1"}
    assert not a.update(lambda ann: None)  # nothing to write


def test_update_after_losing_the_lease_is_fenced_even_if_still_valid_locally() -> None:
    w = World()
    a, b = w.elector("a"), w.elector("b")
    a.try_acquire_or_renew()
    a.release()  # (or a takeover a has not noticed yet)
    a._leader, a._renewed_at = True, w.t  # a believes it still leads
    b.try_acquire_or_renew()
    with pytest.raises(Fenced):
        a.update(lambda ann: {**ann, "k": "stale"})
    assert w.lease.obj is not None and "k" not in w.lease.obj.annotations


def test_settings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry_s < renew_deadline_s < duration_s"):
        LeaseSettings(duration_s=10, renew_deadline_s=10)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 12), st.booleans()),
        min_size=1,
        max_size=80,
    ),
    skews=st.tuples(*[st.floats(-30, 30)] * 3),
)
def test_never_two_leaders_and_no_takeover_before_a_promise_ends(
    steps: list[tuple[str, float, bool]], skews: tuple[float, float, float]
) -> None:
    """Random schedules of three replicas with skewed wall clocks, pauses (a replica that
    does not run for a while) and releases. At every moment at most one may act, and nobody
    acquires before every other replica's last promise (`fence()`: the seconds its writes
    may still take) has run out."""
    w = World()
    reps = {
        name: w.elector(name, skew_s=skew, mono_offset=i * 1000.0)
        for i, (name, skew) in enumerate(zip("abc", skews, strict=True))
    }
    promise = dict.fromkeys(reps, float("-inf"))  # real time until which each may write
    for name, dt, release in steps:
        w.t += dt
        rep = reps[name]
        was = rep.is_leader()
        if release and was:
            rep.release()  # it stopped writing first (the loop ended)
            promise[name] = w.t
        elif rep.try_acquire_or_renew() and not was:
            for other, until in promise.items():
                assert other == name or w.t >= until, (name, other, w.t, until)
        acting = []
        for other, r in reps.items():
            try:
                left = r.fence()
            except Fenced:
                continue
            acting.append(other)
            promise[other] = max(promise[other], w.t + left)
        assert len(acting) <= 1, acting
