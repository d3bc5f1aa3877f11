"""Replace is verified: a REPLACE counts only when another machine joins and passes preflight.

Where the node survives the replacement (a hook that swaps the machine behind the same
Node, Slurm), its record says which machine was given back (`Record.provider_id`,
`boot_id`) and the policy waits for another one (`policy._new_machine`). Where replacing
deletes the Node (Kubernetes `replace: delete-node`), the record goes with it; this ledger
remembers what was given back, so the controller can tell the two outcomes apart:

- the same machine registers again (its kubelet recreated the Node: no Karpenter or node
  group acted): matched by provider id, or by name and boot id when the provider gives
  none. It is quarantined: a person must swap it.
- a new machine joins the pool: it answers the oldest pending replacement (the same name
  first), validates before work even without the `gpuvigil.io/unvalidated` taint, and the
  replacement counts (`remediation REPLACE succeeded`) when it passes.

The ledger is the controller's memory (entries expire after `replace_timeout_s`): a
controller restarted in between sees a returning machine as a new node, which validates
only under the unvalidated taint (register nodes with it: docs/controller.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuvigil.platform.state import NodeView


@dataclass(frozen=True)
class GivenBack:
    node: str
    pool: str
    provider_id: str
    boot_id: str
    at: datetime


@dataclass(frozen=True)
class Verdict:
    returned: str = ""  # the same machine came back: why it is quarantined
    replaces: str = ""  # a new machine: the node whose replacement it answers


class Replacements:
    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.pending: dict[str, GivenBack] = {}
        self._verdicts: dict[str, Verdict] = {}
        self._seen: dict[str, datetime] = {}  # when each node name was first listed

    def given_back(self, node: NodeView, *, pool: str, now: datetime) -> None:
        self.pending[node.name] = GivenBack(node.name, pool, node.provider_id, node.boot_id, now)

    def observe(
        self, nodes: Sequence[NodeView], *, now: datetime, pool_of: Callable[[NodeView], str]
    ) -> list[GivenBack]:
        """Match the nodes gpuvigil has no record of against what was given back; returns
        the replacements that expired with no new machine (the caller says so)."""
        self._verdicts = {}
        # a name that left and came back registered again: it is new from now
        self._seen = {v.name: self._seen.get(v.name, now) for v in nodes}
        kept = {v.name for v in nodes if v.record is not None}  # its record verifies it
        expired = [g for g in self.pending.values()
                   if (now - g.at).total_seconds() > self.timeout_s]  # fmt: skip
        for g in expired:
            del self.pending[g.node]
        expired = [g for g in expired if g.node not in kept]
        if not self.pending:
            return expired
        for v in sorted((v for v in nodes if v.record is None), key=lambda v: v.name):
            same = next((g for g in self.pending.values() if _same_machine(g, v)), None)
            if same is not None:
                del self.pending[same.node]
                self._verdicts[v.name] = Verdict(
                    returned=f"given back for replacement at {same.at:%Y-%m-%d %H:%M:%S} "
                    f"(as {same.node}) and the same machine came back: a person must swap it"
                )
                continue
            pool, first = pool_of(v), self._seen[v.name]
            mine = [g for g in self.pending.values() if g.node == v.name] or sorted(
                # a node listed before the machine was given back is not its replacement
                (g for g in self.pending.values() if g.pool == pool and first > g.at),
                key=lambda g: g.at,
            )
            if mine:
                del self.pending[mine[0].node]
                self._verdicts[v.name] = Verdict(replaces=mine[0].node)
        return expired

    def verdict(self, node: NodeView) -> Verdict | None:
        return self._verdicts.get(node.name)


def _same_machine(g: GivenBack, v: NodeView) -> bool:
    if g.provider_id and v.provider_id:
        return g.provider_id == v.provider_id
    return bool(g.node == v.name and g.boot_id and g.boot_id == v.boot_id)
