"""Leader election over a compare-and-swap Lease, timed as client-go times it.

`gpuvigil controller` runs two replicas; `LeaderElector.run` acquires or renews the Lease
in a thread, and every write the controller makes passes the elector's `fence()` first.

Why it cannot elect two (docs/controller.md "One leader"):
- Expiry is judged from *local observation*, never from the timestamps in the Lease: a
  standby notes, on its own monotonic clock, when it last saw the Lease change (its
  version), and may take over only after `duration_s` without a change. Another replica's
  `renewTime` is written for people and never compared with this clock, so a skewed wall
  clock changes nothing.
- The leader counts its own term from the moment its last successful write *began*
  (`renewed_at`), also on its monotonic clock, and stops acting `renew_deadline_s` later
  unless a renewal succeeds. A standby's observation of that write comes after it began,
  so at least `duration_s - renew_deadline_s` separates the leader's last permitted write
  from the earliest takeover; `fence()` returns what is left of that, and the adapters cap
  each write's timeout with it.
- Every write to the Lease is a compare-and-swap on its version, so of two replicas that
  both believe it expired, one wins.

The same object carries the disruption budget (`platform.budget`): `update()` changes its
annotations only while this replica holds the Lease, in the same compare-and-swap, which
makes each budget change a proof of leadership at that instant.

`LeaderElector(..., elect=False)` is the lone controller (`leader_election: false`, the
simulator, tests): always the leader, never fenced, and `update()` is a plain CAS.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import Field, model_validator

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import utcnow
from gpuvigil.platform.clusters.base import (
    ClusterError,
    Conflict,
    Fenced,
    LeaseObject,
    LeaseStore,
)

log = logging.getLogger("gpuvigil.leader")


class LeaseSettings(StrictModel):
    """`controller.lease:` (client-go's defaults; docs/controller.md explains each)."""

    duration_s: float = Field(15.0, gt=0)  # a standby takes over after this long unchanged
    renew_deadline_s: float = Field(10.0, gt=0)  # the leader stops acting this long after
    retry_s: float = Field(2.0, gt=0)  # the leader renews, and a standby looks, this often

    @model_validator(mode="after")
    def _ordered(self) -> LeaseSettings:
        if not self.retry_s < self.renew_deadline_s < self.duration_s:
            raise ValueError("need retry_s < renew_deadline_s < duration_s")
        return self


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        store: LeaseStore,
        *,
        identity: str,
        settings: LeaseSettings | None = None,
        elect: bool = True,
        wall: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.store, self.identity = store, identity
        self.settings = settings or LeaseSettings()
        self.elect = elect
        self.wall, self.mono = wall, monotonic
        self.on_change = on_change
        self._lock = threading.RLock()  # one Lease write at a time from this process
        self._observed: str | None = None  # the Lease version last seen ...
        self._observed_at = 0.0  # ... and when, on this replica's monotonic clock
        self._renewed_at: float | None = None  # start of our last successful write as holder
        self._leader = False

    # ---- what the controller asks ------------------------------------------------------

    def is_leader(self) -> bool:
        """True only while the last successful renewal began less than the renew deadline
        ago (always, without election)."""
        if not self.elect:
            return True
        with self._lock:
            if self._leader and not self._valid(self.mono()):
                self._set(False)
            return self._leader

    def fence(self) -> float:
        """Before every write: the seconds left before another replica could take over;
        raises `Fenced` when this replica may not act."""
        if not self.elect:
            return math.inf
        now = self.mono()
        if not self._leader or not self._valid(now):
            raise Fenced(f"{self.identity} does not hold the lease")
        assert self._renewed_at is not None
        return self._renewed_at + self.settings.duration_s - now

    def update(self, change: Callable[[dict[str, str]], dict[str, str] | None]) -> bool:
        """Change the Lease's annotations by compare-and-swap while holding it (the budget
        ledger). `change` gets a copy and returns the new annotations, or None to write
        nothing (then False is returned). Raises `Fenced` when not the holder."""
        for _ in range(5):
            with self._lock:
                self.fence()
                started = self.mono()
                lease = self.store.get()
                if lease is None:
                    if self.elect:
                        self._set(False)
                        raise Fenced("the lease is gone")
                    new = change({})
                    if new is None:
                        return False
                    try:
                        self.store.create({"holderIdentity": ""}, new)
                    except Conflict:
                        continue
                    return True
                holder = lease.spec.get("holderIdentity") or ""
                if self.elect and holder != self.identity:
                    self._set(False)
                    raise Fenced(f"the lease is held by {holder or 'nobody'}")
                new = change(dict(lease.annotations))
                if new is None:
                    return False
                spec = dict(lease.spec)
                if self.elect:
                    spec["renewTime"] = _micro(self.wall())
                try:
                    written = self.store.replace(spec, new, version=lease.version)
                except Conflict:
                    continue  # a renewal of ours, or a takeover: the next try tells
                if self.elect:  # a write as holder with nothing between: it renews
                    self._renewed_at = started
                    self._see(written)
                return True
        raise Conflict("the lease kept changing under the budget update")

    # ---- acquiring and renewing -----------------------------------------------------------

    def _valid(self, now: float) -> bool:
        return self._renewed_at is not None and now - self._renewed_at < (
            self.settings.renew_deadline_s
        )

    def _see(self, lease: LeaseObject | None) -> None:
        version = lease.version if lease is not None else None
        if version != self._observed:
            self._observed, self._observed_at = version, self.mono()

    def _expired(self, lease: LeaseObject) -> bool:
        """Free to take: nobody holds it, or this replica has watched it stay unchanged
        for a whole lease duration (the longer of ours and the one written in it)."""
        if not lease.spec.get("holderIdentity"):
            return True
        written = lease.spec.get("leaseDurationSeconds")
        duration = max(self.settings.duration_s, float(written or 0))
        return self.mono() - self._observed_at >= duration

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            log.warning("%s %s leadership", self.identity, "acquired" if leader else "lost")
            self._leader = leader
            if self.on_change:
                self.on_change(leader)

    def _spec(self, lease: LeaseObject | None) -> dict[str, Any]:
        now = _micro(self.wall())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.settings.duration_s),
            "renewTime": now,  # for people (kubectl); no replica compares it with its clock
        }
        old: Mapping[str, Any] = lease.spec if lease is not None else {}
        if old.get("holderIdentity") == self.identity:
            spec["acquireTime"] = old.get("acquireTime") or now
            spec["leaseTransitions"] = old.get("leaseTransitions") or 0
        else:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = (old.get("leaseTransitions") or 0) + (lease is not None)
        return spec

    def try_acquire_or_renew(self) -> bool:
        if not self.elect:
            return True
        with self._lock:
            started = self.mono()
            try:
                lease = self.store.get()
                self._see(lease)
                if lease is None:
                    written = self.store.create(self._spec(None), {})
                else:
                    holder = lease.spec.get("holderIdentity") or ""
                    if holder != self.identity and not self._expired(lease):
                        self._set(False)
                        return False
                    written = self.store.replace(
                        self._spec(lease), dict(lease.annotations), version=lease.version
                    )
            except Conflict:  # another replica wrote between our read and our write
                self._set(False)
                return False
            except ClusterError as e:  # unreachable: still leader until the deadline
                log.info("lease renewal failed: %s", e)
                return self.is_leader()
            self._see(written)
            self._renewed_at = started
            self._set(True)
            return True

    def run(self, stop: threading.Event) -> None:
        """Acquire/renew every `retry_s` until `stop`; then give the Lease up so that a
        standby takes over at once."""
        while not stop.is_set():
            self.try_acquire_or_renew()
            stop.wait(self.settings.retry_s)
        self.release()

    def release(self) -> None:
        if not self.elect or not self._leader:
            return
        with self._lock:
            try:
                lease = self.store.get()
                if lease is not None and lease.spec.get("holderIdentity") == self.identity:
                    spec = dict(lease.spec)
                    spec.update(holderIdentity="", leaseDurationSeconds=1)
                    self.store.replace(spec, dict(lease.annotations), version=lease.version)
            except ClusterError as e:
                log.info("could not release the lease: %s", e)
            self._set(False)
