"""The circuit breaker: a fleet-wide cause is not N hardware faults. Pure (takes `now`).

Two kinds of cause, each judged every pass from what the nodes show:

- a **signature** (`platform.signatures`): one finding concentrated on nodes that share an
  attribute beyond what independent faults explain (a bad driver on 48 nodes of one pool).
  While it is open, the findings it covers neither block a node nor start a disruption
  (`breaker_hold_blocks`), and a node already being repaired whose remaining problem is
  held waits instead of escalating. It stays open while any node still shows it and closes
  `breaker_close_after_s` after the last one cleared. From `breaker_probe_after_s` on, one
  held node at a time is let through as a probe (ladder capped at REBOOT, idle nodes
  first): if the repair cures it, the signature is a repairable fault after all and its
  nodes are released to the normal policy; if not, the next probe waits
  `breaker_probe_interval_s`.
- **stale** per pool (`platform.stale`): reports missing or stale on many nodes of a pool at
  once is the monitoring's failure; the pool's stale nodes are then neither blocked nor
  quarantined, and gpuvigil lifts the blocks it set for staleness alone.

The breaker's memory (when each finding was first seen, open causes, probes) is rebuilt
from the level after a restart: a restarted controller re-trips on what is still shown.
Called by the controller each pass (`update`), then per node through `safety.Gate`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpuvigil.core.findings import Action, Status
from gpuvigil.platform.safety import SafetyConfig, episode_start, pool_of
from gpuvigil.platform.signatures import (
    ANY,
    Burst,
    Key,
    Signature,
    bursts,
    census,
    expected,
    log_poisson_tail,
    node_attributes,
)
from gpuvigil.platform.stale import Change, StaleCause, judge_stale
from gpuvigil.platform.state import NodeView, State

PROBE_MAX_STEP = Action.REBOOT  # a probe tells a change from a fault; it never replaces
HELD = "circuit breaker"  # every reason the breaker gives a held node starts with this


@dataclass
class OpenSignature:
    burst: Burst
    opened_at: datetime
    nodes: int = 0  # nodes showing it now
    clear_since: datetime | None = None
    probe: str = ""  # the node let through as a probe
    probe_since: datetime | None = None
    last_probe_end: datetime | None = None
    probes_failed: int = 0
    probe_cured: str = ""  # the probe node whose repair cured it (the signature then closes)

    @property
    def signature(self) -> Signature:
        return self.burst.signature


@dataclass(frozen=True)
class Hold:
    """What the breaker holds on one node (built by `Breaker.hold_for`)."""

    keys: frozenset[Key] = frozenset()  # findings that neither block nor disrupt
    reason: str = ""
    stale: str = ""  # the node's pool is silent: why staleness is not acted on
    probe: bool = False  # let through as a probe: its ladder stops at PROBE_MAX_STEP
    mark: tuple[str, ...] = ()  # the holding signature, written on the node's record


@dataclass
class BreakerStatus:
    """The summary the controller exports (metric, `PassResult.breaker_open`)."""

    open: bool = False
    reason: str = ""
    trips: int = 0
    causes: list[str] = field(default_factory=list)


class Breaker:
    def __init__(self, config: SafetyConfig, *, heartbeat_stale_s: float = 300.0) -> None:
        self.config = config
        self.heartbeat_stale_s = heartbeat_stale_s  # the policy's: older reports are stale
        self.signatures: dict[str, OpenSignature] = {}
        self.stale: dict[str, StaleCause] = {}  # pool -> its open stale cause
        self.first_seen: dict[tuple[str, str, str], datetime] = {}
        self.cured: set[str] = set()  # closed by a probe's repair: not restored from marks
        self.status = BreakerStatus()
        self._attrs: dict[str, dict[str, str]] = {}

    # ---- one pass -------------------------------------------------------------------

    def update(self, nodes: Sequence[NodeView], *, now: datetime) -> list[Change]:
        """Judge this pass's nodes; returns the causes that opened or closed."""
        cfg = self.config
        self._attrs = {v.name: node_attributes(v, cfg) for v in nodes}
        sizes = census(nodes, cfg)
        changes = judge_stale(self.stale, nodes, sizes, now=now, config=cfg,
                              heartbeat_stale_s=self.heartbeat_stale_s)  # fmt: skip
        self.status.trips += sum(c.state == "open" for c in changes)
        changes += self._restore(nodes, sizes, now)
        new = self._new_findings(nodes, now)
        showing = self._showing(nodes)
        for sid, sig in list(self.signatures.items()):
            sig.nodes = len(showing.get(sid, ()))
            had = sig.burst.describe(cfg.breaker_window_s)
            if self._judge_probe(sig, nodes, now):
                del self.signatures[sid]
                self.cured.add(sid)
                why = f"a probe's repair cured {sig.probe_cured}: a repairable fault, not a change"
                changes.append(Change("closed", sid, f"{why}; had held: {had}"))
                continue
            if sig.nodes:
                sig.clear_since = None
                continue
            sig.clear_since = sig.clear_since or now
            if (now - sig.clear_since).total_seconds() >= cfg.breaker_close_after_s:
                del self.signatures[sid]
                why = f"no node shows it for {cfg.breaker_close_after_s:.0f} s"
                changes.append(Change("closed", sid, f"{why}; had held: {had}"))
        # What an open signature already covers is not new evidence of another cause.
        fresh = {n: {k for k in keys if not self._covered(n, k)} for n, keys in new.items()}
        for burst in bursts(fresh, self._attrs, sizes, cfg):
            sid = burst.signature.id
            if sid in self.signatures:
                continue
            self.signatures[sid] = OpenSignature(burst, now, nodes=len(burst.nodes))
            self.status.trips += 1
            changes.append(Change("open", sid, burst.describe(cfg.breaker_window_s),
                                  _detail(burst)))  # fmt: skip
        self._summarise()
        return changes

    def _restore(
        self, nodes: Sequence[NodeView], sizes: Counter[tuple[str, str]], now: datetime
    ) -> list[Change]:
        """Reopen the signatures the records say hold nodes that still show them (a
        restarted controller holds what the one that died held; the policy writes the
        mark, `Record.hold`)."""
        marked: dict[Signature, list[str]] = {}
        for v in nodes:
            rec = v.record
            if rec is None or len(rec.hold) != 4 or not self._eligible(v):
                continue
            sig = Signature(*rec.hold)
            if sig.id in self.signatures or sig.id in self.cured:
                continue
            if _shows(v, sig, self._attrs[v.name]):
                marked.setdefault(sig, []).append(v.name)
        out = []
        for sig, names in marked.items():
            n = max(sizes.get((sig.attribute, sig.value), 0), len(names))
            lam = expected(n, self.config)
            burst = Burst(sig, tuple(sorted(names)), n, lam, log_poisson_tail(len(names), lam))
            self.signatures[sig.id] = OpenSignature(burst, now, nodes=len(names))
            why = burst.describe(self.config.breaker_window_s)
            reason = f"restored from the nodes' records: {why}"
            out.append(Change("open", sig.id, reason, {**_detail(burst), "restored": True}))
        return out

    def _covered(self, node: str, key: Key) -> bool:
        attrs = self._attrs.get(node, {})
        return any(s.signature.covers(key, attrs) for s in self.signatures.values())

    def _eligible(self, v: NodeView) -> bool:
        """Nodes a person owns (QUARANTINED, or blocked by someone else and left alone)
        are not part of a fleet event gpuvigil must judge."""
        if v.record is not None and v.record.state is State.QUARANTINED:
            return False
        return not (episode_start(v.record) is None and v.blocked_by_others)

    def _new_findings(self, nodes: Sequence[NodeView], now: datetime) -> dict[str, set[Key]]:
        """node -> findings first seen within the window. A node in an episode that this
        process never saw before dates them from the episode's start (level-based)."""
        window, seen = self.config.breaker_window_s, set()
        out: dict[str, set[Key]] = {}
        for v in nodes:
            if v.health is None or not self._eligible(v):
                continue
            for f in v.health.findings:
                if f.status is not Status.FAILED:
                    continue
                key = (v.name, f.check, f.code)
                seen.add(key)
                first = self.first_seen.get(key)
                if first is None:
                    first = self.first_seen[key] = episode_start(v.record) or now
                if (now - first).total_seconds() <= window:
                    out.setdefault(v.name, set()).add((f.check, f.code))
        for key in [k for k in self.first_seen if k not in seen]:
            del self.first_seen[key]
        return out

    def _showing(self, nodes: Sequence[NodeView]) -> dict[str, set[str]]:
        """signature id -> the eligible nodes that show it now."""
        out: dict[str, set[str]] = {sid: set() for sid in self.signatures}
        if not self.signatures:
            return out
        for v in nodes:
            if v.health is None or not self._eligible(v):
                continue
            attrs = self._attrs[v.name]
            keys = {(f.check, f.code) for f in v.health.findings if f.status is Status.FAILED}
            for sid, s in self.signatures.items():
                if any(s.signature.covers(k, attrs) for k in keys):
                    out[sid].add(v.name)
        return out

    # ---- probes ---------------------------------------------------------------------

    def _judge_probe(self, sig: OpenSignature, nodes: Sequence[NodeView], now: datetime) -> bool:
        """Start, follow or end this signature's probe; True when the probe's repair cured
        it (the signature is then a repairable fault and closes)."""
        cfg = self.config
        if sig.probe:
            v = next((n for n in nodes if n.name == sig.probe), None)
            shows = v is not None and _shows(v, sig.signature, self._attrs.get(v.name, {}))
            state = v.record.state if v is not None and v.record is not None else State.HEALTHY
            if v is not None and not shows and state is State.HEALTHY:
                sig.probe_cured = sig.probe
                return True
            if v is None or state is State.QUARANTINED:
                sig.probe, sig.last_probe_end = "", now
                sig.probes_failed += 1
            return False
        since = sig.last_probe_end or sig.opened_at
        wait = cfg.breaker_probe_interval_s if sig.last_probe_end else cfg.breaker_probe_after_s
        if (now - since).total_seconds() < wait:
            return False
        candidates = [
            v
            for v in nodes
            if self._eligible(v)
            and _shows(v, sig.signature, self._attrs.get(v.name, {}))
            and (v.record is None or v.record.state in (State.HEALTHY, State.SUSPECT))
        ]
        if candidates:  # an idle node first: a probe should cost no job
            pick = min(candidates, key=lambda v: (v.running > 0, v.name))
            sig.probe, sig.probe_since = pick.name, now
        return False

    # ---- per node -------------------------------------------------------------------

    def hold_for(self, node: NodeView) -> Hold:
        """What the open causes hold on this node."""
        stale = self.stale.get(pool_of(node, self.config))
        stale_reason = f"{HELD}: {stale.reason}" if stale else ""
        if not self.signatures or node.health is None:
            return Hold(stale=stale_reason)
        attrs = self._attrs.get(node.name) or node_attributes(node, self.config)
        keys: set[Key] = set()
        why: list[str] = []
        marks: list[tuple[str, ...]] = []
        probe = False
        for sig in self.signatures.values():
            if sig.probe == node.name:
                probe = True
                continue
            covered = {(f.check, f.code) for f in node.health.findings
                       if sig.signature.covers((f.check, f.code), attrs)}  # fmt: skip
            if covered:
                keys |= covered
                why.append(sig.signature.id)
                s = sig.signature
                marks.append((s.check, s.code, s.attribute, s.value))
        reason = (
            f"{HELD} holds {', '.join(why)} (suspected change: "
            f"{', '.join(sorted({self.signatures[w].signature.change for w in why}))})"
            if why
            else ""
        )
        return Hold(frozenset(keys), reason, stale_reason, probe, min(marks, default=()))

    def _summarise(self) -> None:
        st = self.status
        st.causes = [*sorted(self.signatures), *(f"stale:{p}" for p in sorted(self.stale))]
        st.open = bool(st.causes)
        parts = [s.burst.describe(self.config.breaker_window_s) for s in self.signatures.values()]
        st.reason = "; ".join([*parts, *(c.reason for c in self.stale.values())])


def _shows(v: NodeView, sig: Signature, attrs: dict[str, str]) -> bool:
    if v.health is None:
        return False
    return any(
        f.status is Status.FAILED and sig.covers((f.check, f.code), attrs)
        for f in v.health.findings
    )


def _detail(burst: Burst) -> dict[str, object]:
    s = burst.signature
    return {
        "check": s.check,
        "code": s.code if s.key != ANY else "*",
        "attribute": s.attribute,
        "value": s.value,
        "change": s.change,
        "also": list(burst.also),
        "nodes": len(burst.nodes),
        "population": burst.population,
        "expected": round(burst.expected, 6),
        "p": burst.p,
        "log10_p": round(burst.log_p / math.log(10), 2),
    }
