"""Leader election over an in-memory Lease with virtual time (the real Lease is exercised
by tests/integration/controller/test_cli.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from helpers import T0

from gpuvigil.platform.clusters.base import Conflict
from gpuvigil.platform.leader import LeaderElector


class MemLease:
    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.rv = 0

    def get(self) -> dict[str, Any] | None:
        return None if self.obj is None else {**self.obj, "spec": dict(self.obj["spec"])}

    def create(self, spec: dict[str, Any]) -> None:
        if self.obj is not None:
            raise Conflict("exists")
        self.rv += 1
        self.obj = {"metadata": {"resourceVersion": str(self.rv)}, "spec": dict(spec)}

    def replace(self, spec: dict[str, Any], *, version: str) -> None:
        assert self.obj is not None
        if version != self.obj["metadata"]["resourceVersion"]:
            raise Conflict("stale")
        self.rv += 1
        self.obj = {"metadata": {"resourceVersion": str(self.rv)}, "spec": dict(spec)}


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self):  # type: ignore[no-untyped-def]
        return self.t


def test_one_leader_and_takeover_after_the_lease_expires() -> None:
    lease, clock = MemLease(), Clock()
    a = LeaderElector(lease, identity="a", lease_duration_s=15, clock=clock)
    b = LeaderElector(lease, identity="b", lease_duration_s=15, clock=clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.is_leader() and not b.is_leader()
    clock.t += timedelta(seconds=5)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    # a dies (stops renewing); b takes over once the lease has expired, not before.
    clock.t += timedelta(seconds=14)
    assert not b.try_acquire_or_renew()
    clock.t += timedelta(seconds=2)
    assert b.try_acquire_or_renew() and b.is_leader()
    assert lease.obj["spec"]["leaseTransitions"] == 1
    # a, back from a long pause, stepped down already: no two leaders act at once.
    assert not a.is_leader()
    assert not a.try_acquire_or_renew()


def test_release_hands_over_at_once() -> None:
    lease, clock = MemLease(), Clock()
    a = LeaderElector(lease, identity="a", clock=clock)
    b = LeaderElector(lease, identity="b", clock=clock)
    a.try_acquire_or_renew()
    a.release()
    clock.t += timedelta(seconds=2)
    assert b.try_acquire_or_renew()


def test_a_leader_that_cannot_renew_steps_down_before_the_lease_ends() -> None:
    lease, clock = MemLease(), Clock()
    a = LeaderElector(lease, identity="a", lease_duration_s=15, clock=clock)
    a.try_acquire_or_renew()
    clock.t += timedelta(seconds=11)  # renew deadline is 2/3 of the lease
    assert not a.is_leader()
