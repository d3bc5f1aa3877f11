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
from datetime import datetime, timedelta

from gpuvigil.core.findings import Action, Status
from gpuvigil.platform.policy import PROBE_FAILED
from gpuvigil.platform.safety import SafetyConfig, pool_of
from gpuvigil.platform.signatures import (
    ANY,
    FLEET,
    Burst,
    Key,
    Signature,
    bursts,
    census,
    expected,
    in_pool,
    log_poisson_tail,
    node_attributes,
)
from gpuvigil.platform.stale import Change, StaleCause, judge_stale
from gpuvigil.platform.state import NodeView, State, episode_start

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
    hardware: bool = False  # on a topology attribute: a hardware event, held nowhere
    members: set[str] = field(default_factory=set)  # every node seen showing it while open
    grew_at: datetime | None = None  # when the last new node showed it (None: opened_at)

    @property
    def signature(self) -> Signature:
        return self.burst.signature

    def probe_due(self, config: SafetyConfig) -> datetime:
        """When the next probe may start: `breaker_probe_after_s` after the signature last
        spread to a new node (a rollout still reaching nodes is evidence of the change
        with every batch; a probe then only reboots a healthy machine), and
        `breaker_probe_interval_s` after a probe that did not cure it."""
        grown = (self.grew_at or self.opened_at) + timedelta(seconds=config.breaker_probe_after_s)
        if self.last_probe_end is None:
            return max(grown, self.opened_at + timedelta(seconds=config.breaker_probe_after_s))
        return max(grown, self.last_probe_end + timedelta(seconds=config.breaker_probe_interval_s))


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
    hardware: list[str] = field(default_factory=list)  # open hardware events (never held)


class Breaker:
    def __init__(self, config: SafetyConfig, *, heartbeat_stale_s: float = 300.0) -> None:
        self.config = config
        self.heartbeat_stale_s = heartbeat_stale_s  # the policy's: older reports are stale
        self.signatures: dict[str, OpenSignature] = {}
        self.stale: dict[str, StaleCause] = {}  # pool -> its open stale cause
        self.first_seen: dict[tuple[str, str, str], datetime] = {}
        # closed by a probe's repair: not restored from marks, and what its nodes showed
        # before then is no evidence of a cause (the level would re-trip on it)
        self.cured: dict[str, tuple[Signature, datetime]] = {}
        self.spent: dict[str, tuple[Signature, datetime]] = {}  # any other closed cause
        # (node, finding) -> when first seen and the node's attributes then, for
        # breaker_level_window_s: the level counts nodes repaired or replaced since
        self.recent: dict[tuple[str, Key], tuple[datetime, dict[str, str]]] = {}
        # (attribute, value) -> when this process saw it appear in the fleet (None: there
        # at its first pass, a baseline). Forgotten when no node carries it any more.
        self.value_since: dict[tuple[str, str], datetime | None] = {}
        self.status = BreakerStatus()
        self._attrs: dict[str, dict[str, str]] = {}
        self._sizes: Counter[tuple[str, str]] = Counter()
        self._now: datetime | None = None
        self._tracked = False  # value_since has its baseline (the first pass)

    # ---- one pass -------------------------------------------------------------------

    def update(self, nodes: Sequence[NodeView], *, now: datetime) -> list[Change]:
        """Judge this pass's nodes; returns the causes that opened or closed."""
        cfg = self.config
        self._attrs = {v.name: node_attributes(v, cfg) for v in nodes}
        sizes = self._sizes = census(nodes, cfg)
        self._now = now
        self._track_values(sizes, now)
        changes = judge_stale(self.stale, nodes, sizes, now=now, config=cfg,
                              heartbeat_stale_s=self.heartbeat_stale_s)  # fmt: skip
        self.status.trips += sum(c.state == "open" for c in changes)
        changes += self._restore(nodes, sizes, now)
        new = self._new_findings(nodes, now)
        showing = self._showing(nodes)
        for sid, sig in list(self.signatures.items()):
            now_showing = showing.get(sid, set())
            sig.nodes = len(now_showing)
            if now_showing - sig.members:
                sig.members |= now_showing
                sig.grew_at = now
            had = sig.burst.describe(cfg.breaker_window_s)
            if not sig.hardware and self._judge_probe(sig, nodes, now):
                del self.signatures[sid]
                self.cured[sid] = (sig.signature, now)
                why = f"a probe's repair cured {sig.probe_cured}: a repairable fault, not a change"
                changes.append(Change("closed", sid, f"{why}; had held: {had}"))
                continue
            if sig.nodes:
                sig.clear_since = None
                continue
            sig.clear_since = sig.clear_since or now
            if (now - sig.clear_since).total_seconds() >= cfg.breaker_close_after_s:
                del self.signatures[sid]
                self.spent[sid] = (sig.signature, now)
                why = f"no node shows it for {cfg.breaker_close_after_s:.0f} s"
                changes.append(Change("closed", sid, f"{why}; had held: {had}"))
        changes += self._trip(new, sizes, now)
        self._summarise()
        return changes

    def _trip(
        self,
        showing: dict[str, dict[Key, datetime]],
        sizes: Counter[tuple[str, str]],
        now: datetime,
    ) -> list[Change]:
        """Open the causes that explain the findings: by rate (new within
        `breaker_window_s`, on the nodes showing them), then by level (begun within
        `breaker_level_window_s`, on the nodes that showed them, cured or replaced since
        included: a rollout in small batches whose first nodes were repaired still counts).
        What an open holding cause covers, or a closed one covered before it closed, is no
        new evidence. A burst on one topology value is a hardware event; the same finding
        on a second value of that attribute is no longer one rack's or switch's, and the
        broader cause is sought without topology."""
        cfg = self.config
        topology = set(cfg.breaker_topology_attributes)
        changes: list[Change] = []
        level: dict[str, dict[Key, datetime]] = {}
        then: dict[str, dict[str, str]] = {}  # the level's nodes as they were when seen
        for (node, key), (first, seen_attrs) in self.recent.items():
            level.setdefault(node, {})[key] = first
            then.setdefault(node, seen_attrs)
        for window, source, attrs in ((cfg.breaker_window_s, showing, self._attrs),
                                      (cfg.breaker_level_window_s, level, then)):  # fmt: skip
            fresh = {
                n: {k for k, t in keys.items()
                    if (now - t).total_seconds() <= window and not self._covered(n, k, attrs[n])
                    and not self._cured_before(k, t, attrs[n])}
                for n, keys in source.items()
            }  # fmt: skip
            skip = self._spreading()
            while True:
                found = bursts(fresh, attrs, sizes, cfg, window_s=window, admit=self._admit,
                               no_topology=skip)  # fmt: skip
                spread = {
                    b.signature.key
                    for b in found
                    if b.signature.attribute in topology and self._elsewhere(b, found)
                }
                if spread <= skip:
                    break
                skip |= spread
            for burst in found:
                sid = burst.signature.id
                if sid in self.signatures:
                    continue
                hardware = burst.signature.attribute in topology
                self.signatures[sid] = OpenSignature(
                    burst, now, nodes=len(burst.nodes), hardware=hardware,
                    members=set(burst.nodes),
                )  # fmt: skip
                self.status.trips += not hardware
                detail = {**_detail(burst), "hardware": hardware}
                reason = burst.describe(cfg.breaker_window_s)
                if hardware:
                    where = reason.split(": suspected")[0]
                    reason = (f"hardware event, not a change: {where}; every node stays "
                              "blocked and is repaired within the budget")  # fmt: skip
                changes.append(Change("open", sid, reason, detail))
        # a holding cause that covers a hardware event's nodes supersedes it
        for sid, sig in list(self.signatures.items()):
            by = self._superseded(sig) if sig.hardware else ""
            if by:
                del self.signatures[sid]
                self.spent[sid] = (sig.signature, now)
                why = f"superseded by {by}: not one {sig.signature.attribute}'s"
                changes.append(Change("closed", sid, why, {"hardware": True}))
        return changes

    def _superseded(self, hw: OpenSignature) -> str:
        """The holding cause that covers every node of this hardware event, if any."""
        key = hw.signature.key
        for sid, o in self.signatures.items():
            if o.hardware:
                continue
            if all(o.signature.covers(key, self._attrs.get(n, {})) for n in hw.burst.nodes):
                return sid
        return ""

    def _spreading(self) -> set[Key]:
        """Findings with open hardware events on two values of one attribute."""
        seen: dict[tuple[Key, str], set[str]] = {}
        for sig in self.signatures.values():
            if sig.hardware:
                s = sig.signature
                seen.setdefault((s.key, s.attribute), set()).add(s.value)
        return {key for (key, _), values in seen.items() if len(values) > 1}

    def _elsewhere(self, burst: Burst, found: list[Burst]) -> bool:
        """Another value of this burst's topology attribute shows the same finding."""
        s = burst.signature
        others = [o.signature for o in self.signatures.values() if o.hardware]
        others += [b.signature for b in found]
        return any(o.key == s.key and o.attribute == s.attribute and o.value != s.value
                   for o in others)  # fmt: skip

    def _track_values(self, sizes: Counter[tuple[str, str]], now: datetime) -> None:
        """When each attribute value appeared (`value_since`)."""
        first, self._tracked = not self._tracked, True
        names = set(self.config.breaker_attributes)
        present = {k for k, n in sizes.items() if n and k[0] in names}
        for key in present:
            if key not in self.value_since:
                self.value_since[key] = None if first else now
        for key in [k for k in self.value_since if k not in present]:
            del self.value_since[key]

    def _admit(self, node: str, attribute: str, value: str) -> bool:
        """May this node's attribute value name a cause? The fleet and topology always
        (a topology cause is a hardware event); a pool only from `breaker_min_pool_nodes`
        nodes; any other attribute only when it is a suspected change: a value that
        appeared within `breaker_change_window_s`, or a minority of its pool."""
        cfg, sizes = self.config, self._sizes
        if attribute == FLEET or attribute in cfg.breaker_topology_attributes:
            return True
        if attribute == cfg.pool_label:
            return sizes.get((attribute, value), 0) >= cfg.breaker_min_pool_nodes
        since = self.value_since.get((attribute, value))
        recent = since is not None and self._now is not None
        if recent and (self._now - since).total_seconds() <= cfg.breaker_change_window_s:  # type: ignore[operator]
            return True
        pool = self._attrs.get(node, {}).get(cfg.pool_label, "")
        size = sizes.get((cfg.pool_label, pool), 0)
        have = sizes.get((in_pool(attribute, pool), value), 0)
        return size > 0 and have * 100 < cfg.breaker_minority_percent * size

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
            self.signatures[sig.id] = OpenSignature(
                burst, now, nodes=len(names), members=set(names)
            )
            why = burst.describe(self.config.breaker_window_s)
            reason = f"restored from the nodes' records: {why}"
            out.append(Change("open", sig.id, reason, {**_detail(burst), "restored": True}))
        return out

    def _cured_before(self, key: Key, first: datetime, attrs: dict[str, str]) -> bool:
        closed = [*self.cured.values(), *self.spent.values()]
        return any(at >= first and s.covers(key, attrs) for s, at in closed)

    def _covered(self, node: str, key: Key, attrs: dict[str, str] | None = None) -> bool:
        """An open holding cause covers it (a hardware event covers nothing: the same
        finding elsewhere may show it is no rack's)."""
        attrs = self._attrs.get(node, {}) if attrs is None else attrs
        return any(s.signature.covers(key, attrs) for s in self.signatures.values()
                   if not s.hardware)  # fmt: skip

    def _eligible(self, v: NodeView) -> bool:
        """A node blocked by someone else and left alone is not part of a fleet event
        gpuvigil must judge. A quarantined one is counted (a burst that quarantines nodes
        one by one must still trip), though the breaker never releases it."""
        return not (episode_start(v.record) is None and v.blocked_by_others)

    def _new_findings(
        self, nodes: Sequence[NodeView], now: datetime
    ) -> dict[str, dict[Key, datetime]]:
        """node -> findings first seen within the level window, with when. A node in an
        episode that this process never saw before dates them from the episode's start
        (level-based)."""
        window = max(self.config.breaker_window_s, self.config.breaker_level_window_s)
        seen = set()
        out: dict[str, dict[Key, datetime]] = {}
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
                    out.setdefault(v.name, {})[(f.check, f.code)] = first
                    self.recent.setdefault(
                        (v.name, (f.check, f.code)), (first, self._attrs[v.name])
                    )
        for key in [k for k in self.first_seen if k not in seen]:
            del self.first_seen[key]
        level = self.config.breaker_level_window_s
        old = [k for k, (t, _) in self.recent.items() if (now - t).total_seconds() > level]
        for k in old:
            del self.recent[k]
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
            failed = (
                state is State.SUSPECT
                and v is not None
                and v.record is not None
                and (v.record.reason.startswith(PROBE_FAILED))
            )
            if v is None or state is State.QUARANTINED or failed:
                sig.probe, sig.last_probe_end = "", now
                sig.probes_failed += 1
            return False
        if now < sig.probe_due(cfg):
            return False
        candidates = [
            v
            for v in nodes
            if self._eligible(v)
            and _shows(v, sig.signature, self._attrs.get(v.name, {}))
            and (v.record is None or v.record.state in (State.HEALTHY, State.SUSPECT))
            and not (v.record is not None and v.record.reason.startswith(PROBE_FAILED))
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
            if sig.hardware:  # a hardware event holds nothing: its nodes are repaired
                continue
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
        held = {k: s for k, s in self.signatures.items() if not s.hardware}
        st.causes = [*sorted(held), *(f"stale:{p}" for p in sorted(self.stale))]
        st.hardware = sorted(k for k, s in self.signatures.items() if s.hardware)
        st.open = bool(st.causes)
        parts = [s.burst.describe(self.config.breaker_window_s) for s in held.values()]
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
