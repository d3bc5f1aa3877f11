"""The disruption budget's one place: the ledger of nodes holding a budget slot.

The ledger is a JSON map node -> pool in the annotation `BUDGET_ANNOTATION` of the
leader's Lease (`platform.leader`), changed only by compare-and-swap through
`LeaderElector.update`, which succeeds only while the writer holds the Lease. Replicas
acting on slightly different node lists therefore cannot both take the last slot: the
second compare-and-swap sees the first one's slot (or fails because it lost the Lease).

The controller keeps the ledger a superset of the nodes whose record is in the budget:
- a slot is taken (`settle`, one write per pass for all of the pass's admissions) before
  the record that starts the disruption is stored;
- a slot is given back (`release`) only after the record that leaves the budget is stored;
- a node in the budget by its record but missing from the ledger (an older version, a lost
  annotation) is adopted;
- a slot whose node is not in the budget (a crash between the two writes) is an orphan: it
  is kept, so the budget errs on the careful side, until this replica has seen it orphaned
  for `orphan_grace_s` on its own clock (longer than any write of a deposed leader can
  still land), then dropped.
The budget in use per pool is the union of the slots and the records (`safety.Gate`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping

from gpuvigil.core.wire import DOMAIN
from gpuvigil.platform.clusters.base import Unavailable
from gpuvigil.platform.leader import LeaderElector

BUDGET_ANNOTATION = f"{DOMAIN}/budget"


def decode(text: str | None) -> dict[str, str] | None:
    """node -> pool; {} when absent; None when unreadable (never raises)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return None
    slots = data.get("slots") if isinstance(data, dict) else None
    if not isinstance(slots, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in slots.items()
    ):
        return None
    return dict(slots)


def encode(slots: Mapping[str, str]) -> str:
    return json.dumps({"v": 1, "slots": dict(sorted(slots.items()))}, separators=(",", ":"))


class Ledger:
    """The controller's handle on the budget ledger (one per controller process)."""

    def __init__(
        self,
        lease: LeaderElector,
        *,
        orphan_grace_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self.orphan_grace_s = orphan_grace_s
        self.mono = monotonic
        self._orphaned: dict[str, float] = {}  # node -> when this replica first saw it so
        self.writes = 0

    def read(self) -> dict[str, str]:
        """The slots now (one read of the Lease). Unavailable when unreadable."""
        lease = self.lease.store.get()
        return _slots(lease.annotations if lease else {})

    def orphans(self, slots: Mapping[str, str], in_budget: Iterable[str]) -> set[str]:
        """Slots to drop now: not in the budget by any record for `orphan_grace_s`."""
        held = set(in_budget)
        now = self.mono()
        for node in list(self._orphaned):
            if node not in slots or node in held:
                del self._orphaned[node]
        for node in slots:
            if node not in held:
                self._orphaned.setdefault(node, now)
        return {n for n, t in self._orphaned.items() if now - t >= self.orphan_grace_s}

    def settle(
        self,
        *,
        admit: Mapping[str, str],
        adopt: Mapping[str, str],
        drop: Iterable[str],
        limits: Mapping[str, int],
    ) -> set[str]:
        """One compare-and-swap: drop orphans, adopt records, then take a slot for each
        node of `admit` (node -> pool, in decision order) while its pool has room by the
        ledger as it is at the write. Returns the admitted nodes; raises `Fenced` when this
        replica does not hold the Lease."""
        admitted: set[str] = set()
        gone = set(drop)

        def change(ann: dict[str, str]) -> dict[str, str] | None:
            admitted.clear()
            slots = _slots(ann)
            new = {n: p for n, p in slots.items() if n not in gone}
            new.update(adopt)
            for node, pool in admit.items():
                if node in new:
                    admitted.add(node)
                    continue
                if sum(1 for p in new.values() if p == pool) < limits.get(pool, 0):
                    new[node] = pool
                    admitted.add(node)
            return _changed(ann, slots, new)

        if self.lease.update(change):
            self.writes += 1
        for node in gone:
            self._orphaned.pop(node, None)
        return admitted

    def release(self, nodes: Iterable[str]) -> None:
        """Give the slots of these nodes back (their records left the budget)."""
        done = set(nodes)
        if not done:
            return

        def change(ann: dict[str, str]) -> dict[str, str] | None:
            slots = _slots(ann)
            return _changed(ann, slots, {n: p for n, p in slots.items() if n not in done})

        if self.lease.update(change):
            self.writes += 1


def _slots(annotations: Mapping[str, str]) -> dict[str, str]:
    slots = decode(annotations.get(BUDGET_ANNOTATION))
    if slots is None:  # fail closed: no new disruption on a ledger nobody can read
        raise Unavailable(f"the budget annotation {BUDGET_ANNOTATION} does not parse")
    return slots


def _changed(
    ann: dict[str, str], old: Mapping[str, str], new: Mapping[str, str]
) -> dict[str, str] | None:
    if new == old:
        return None
    ann[BUDGET_ANNOTATION] = encode(new)
    return ann
