"""Leader election through a coordination.k8s.io/v1 Lease (the client-go protocol).

`gpuvigil controller` runs with 2 replicas; `LeaderElector.run` keeps trying to acquire or
renew the Lease in a thread, and the reconcile loop acts only while `is_leader()`. A
replica that cannot renew within `lease_duration_s` stops acting before anyone else may
take over (it steps down at `renew_deadline`, a third earlier), so two leaders never act
at once; a standby takes over `lease_duration_s` after the leader's last renewal.

The storage is anything with `get() / create(spec) / replace(spec, version=)` over the
Lease's raw JSON: `clusters.kubernetes.LeaseStore` in production.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from gpuvigil.core.findings import utcnow
from gpuvigil.core.wire import decode_time
from gpuvigil.platform.clusters.base import ClusterError, Conflict

log = logging.getLogger("gpuvigil.leader")


class LeaseBackend(Protocol):
    def get(self) -> dict[str, Any] | None: ...
    def create(self, spec: dict[str, Any]) -> None: ...
    def replace(self, spec: dict[str, Any], *, version: str) -> None: ...


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> datetime | None:
    return decode_time(text, assume_utc=True)


class LeaderElector:
    def __init__(
        self,
        backend: LeaseBackend,
        *,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_s: float = 5.0,
        clock: Callable[[], datetime] = utcnow,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.backend, self.identity = backend, identity
        self.duration = timedelta(seconds=lease_duration_s)
        self.renew_deadline = self.duration * 2 / 3
        self.renew_s = renew_s
        self.clock = clock
        self.on_change = on_change
        self._renewed_at: datetime | None = None
        self._leader = False

    def is_leader(self) -> bool:
        """True only while the last successful renewal is recent enough to be safe."""
        if not self._leader or self._renewed_at is None:
            return False
        if self.clock() - self._renewed_at > self.renew_deadline:
            self._set(False)
        return self._leader

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            log.warning("%s %s leadership", self.identity, "acquired" if leader else "lost")
            self._leader = leader
            if self.on_change:
                self.on_change(leader)

    def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.duration.total_seconds()),
            "renewTime": _micro(now),
        }
        try:
            lease = self.backend.get()
            if lease is None:
                spec.update(acquireTime=_micro(now), leaseTransitions=0)
                self.backend.create(spec)
            else:
                cur = lease.get("spec") or {}
                holder = cur.get("holderIdentity")
                renewed = _parse(cur.get("renewTime")) or _parse(cur.get("acquireTime"))
                held_for = timedelta(seconds=cur.get("leaseDurationSeconds") or 0)
                expired = renewed is None or now > renewed + held_for
                if holder and holder != self.identity and not expired:
                    self._set(False)
                    return False
                if holder == self.identity:
                    spec["acquireTime"] = cur.get("acquireTime") or _micro(now)
                    spec["leaseTransitions"] = cur.get("leaseTransitions") or 0
                else:
                    spec["acquireTime"] = _micro(now)
                    spec["leaseTransitions"] = (cur.get("leaseTransitions") or 0) + 1
                self.backend.replace(spec, version=lease["metadata"]["resourceVersion"])
        except Conflict:
            self._set(False)  # someone else wrote first
            return False
        except ClusterError as e:
            log.info("lease renewal failed: %s", e)
            return self.is_leader()
        self._renewed_at = now
        self._set(True)
        return True

    def run(self, stop: threading.Event) -> None:
        """Acquire/renew until `stop`; then give the Lease up so a standby starts at once."""
        while not stop.is_set():
            self.try_acquire_or_renew()
            stop.wait(self.renew_s if self._leader else min(self.renew_s, 2.0))
        self.release()

    def release(self) -> None:
        if not self._leader:
            return
        try:
            lease = self.backend.get()
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = dict(lease["spec"])
                spec.update(holderIdentity="", leaseDurationSeconds=1)
                self.backend.replace(spec, version=lease["metadata"]["resourceVersion"])
        except ClusterError as e:
            log.info("could not release the lease: %s", e)
        self._set(False)
