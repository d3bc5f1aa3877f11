"""Failure attribution: the most likely cause of each failed or restarted job.

Called by `gpuvigil report` (through `observe.summary`) and the simulator's report.
`Attributor` is fed the time-ordered event stream; for each `job.restart` and each failed
`job.end` it gathers the evidence on the job's nodes and the job itself from `lookback_s`
before to `grace_s` after the failure (detection lags the crash: an Xid is logged, then the
agent reports it on its next pass), then `classify` — a pure function — picks the cause
with the first matching rule of `RULES`, else the failure's structured `cause` (what the
training layer recorded, `core.exit_codes.Charged`: the one cause vocabulary; `kind`, what
was seen, is a detail under it). The free-text `reason` and the exit code are shown, never
read for a cause: an event without one (an old log's) is `unknown`, and counted
(`without_cause`). A node moved out of service is evidence by its structured `codes` and
`components` (`drain_kind`), never by its `reason`. Which Xids are the application's doing
comes from the Xid catalog (`node.catalog.xid`: the codes whose action is RESTART_APP).
Memory: a short evidence ring per node and per running job, and the failures still inside
their grace period.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuvigil.core import codes, exit_codes
from gpuvigil.core.events import Event, Kind
from gpuvigil.core.exit_codes import Charged, Retry
from gpuvigil.core.findings import Action
from gpuvigil.core.states import State
from gpuvigil.node.catalog.xid import XidCatalog, load_catalog
from gpuvigil.observe.slo import interrupted

# The causes are core.exit_codes.Charged's (reports list `exit_codes.FAILURES` in order);
# these short names are its members, also the evidence kinds that point at them.
HARDWARE, NETWORK, STORAGE, HANG = Charged.NODE, Charged.NETWORK, Charged.STORAGE, Charged.HANG
# A check that timed out on a GPU (`gpu:N`: the driver call on that GPU never returned) is
# a hung GPU, which is hardware; one that timed out elsewhere is a hung tool.
HUNG = "CHECK_TIMEOUT"

HW_FAMILIES = frozenset(
    {codes.GPU_XID, codes.GPU_MEMORY, codes.GPU_INTERCONNECT, codes.GPU_THERMAL}
)
HW_HEALTH_CODES = frozenset(
    {"GPU_LOST", "GPU_COUNT_LOW", "DCGM_HEALTH_FAIL", "DCGM_DIAG_FAIL", "GPU_SDC", "GPU_SLOW"}
)
SEVERE_ACTIONS = frozenset({"RESET_GPU", "REBOOT", "REPLACE", "INVESTIGATE"})
# A node moved to one of these around a failure had a problem the controller saw (blocked
# or drained); a node returning through VALIDATING had not (`core.states`).
TROUBLED = frozenset(s.value for s in State if s.blocks and s is not State.VALIDATING)
# Charges to someone other than the program that name the cause when no event explains the
# failure better; a drain only weakly (the platform took the node away: its events say why).
CHARGED = frozenset({Charged.NODE, Charged.NETWORK, Charged.HANG, Charged.STORAGE, Charged.DRAIN})


@dataclass(frozen=True)
class Evidence:
    """One event that may explain a failure, reduced to what the rules need."""

    ts: float
    kind: str  # hardware | network | storage | hang | drain | app_xid | tool | info
    text: str
    node: str | None = None
    component: str | None = None
    code: str | None = None
    strong: bool = False  # fatal / severe action


@dataclass(frozen=True)
class Failure:
    ts: float
    job: str
    event: str  # job.restart | job.end
    node: str | None = None  # the node the training layer blamed, if any
    exit_code: int | None = None
    reason: str = ""
    cause: Charged | None = None  # the structured cause the event carries (None: none known)
    kind: str = ""  # what was seen, under that cause (frozen, victim, drained...)


@dataclass(frozen=True)
class Attribution:
    job: str
    ts: float
    event: str
    cause: str
    confidence: float
    summary: str
    node: str | None = None
    component: str | None = None
    code: str | None = None
    evidence: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "ts": self.ts,
            "event": self.event,
            "cause": self.cause,
            "confidence": self.confidence,
            "summary": self.summary,
            "node": self.node,
            "component": self.component,
            "code": self.code,
            "evidence": list(self.evidence),
        }


def describe_code(code: str) -> str:
    if code.startswith("XID_"):
        return f"Xid {code[4:]}"
    if code.startswith("SXID_"):
        return f"SXid {code[5:]}"
    return code


def app_xid(code: str, catalog: XidCatalog | None = None) -> bool:
    """An Xid the catalog says the application causes (its action is RESTART_APP: the node
    is fine), e.g. 13 (graphics engine exception) or 31 (GPU memory page fault)."""
    kind, _, num = code.partition("_")
    if kind != "XID" or not num.isdigit():
        return False
    rule = (catalog or load_catalog()).rule("xid", int(num))
    return rule.known and rule.outcome.action is Action.RESTART_APP


def to_evidence(ev: Event) -> Evidence | None:
    """Reduce one event to evidence, or None when it says nothing about failures."""
    d, node = ev.data, ev.node
    status = str(d.get("status", "FAILED"))
    code = str(d.get("code", ""))
    # An application Xid is a WARNING in the catalog (the node is fine): still evidence.
    if ev.kind == Kind.FINDING_SET and (
        status == "FAILED" or (status == "WARNING" and app_xid(code))
    ):
        comp = str(d.get("component", "node"))
        where = f"{describe_code(code)} on {comp} of {node}"
        strong = bool(d.get("fatal")) or str(d.get("action", "")) in SEVERE_ACTIONS
        family = codes.family_of(code)
        if code == HUNG and comp.startswith("gpu:"):
            kind, where = HARDWARE, f"{comp} of {node} hung (no answer in time)"
        elif code in codes.COULD_NOT_RUN:
            kind = "tool"
        elif app_xid(code):
            kind = "app_xid"
        elif code == "TRAINING_HANG":
            kind = HANG
        elif family in HW_FAMILIES or code in HW_HEALTH_CODES:
            kind = HARDWARE
        elif family == codes.NETWORK_FABRIC:
            kind = NETWORK
        else:
            kind = "info"
        return Evidence(ev.ts, kind, where, node, comp, code, strong)
    if ev.kind == Kind.HANG:
        return _hang(ev)
    if ev.kind == Kind.CHECKPOINT and d.get("result") not in (None, "ok", "succeeded"):
        return Evidence(ev.ts, STORAGE, f"checkpoint {d.get('result')} at step {d.get('step')}")
    to = d.get("to")
    if (
        ev.kind == Kind.NODE_STATE
        and isinstance(to, str)
        and to in TROUBLED
        and not d.get("dry_run")
    ):
        why = str(d.get("reason") or "no reason")  # shown, never read
        kind, code, comp = drain_kind(d)
        return Evidence(ev.ts, kind, f"{node} -> {d.get('to')} ({why})", node, comp, code)
    if ev.kind == Kind.STRAGGLER:
        return Evidence(ev.ts, "info", f"straggler rank {d.get('rank')} on {node}", node)
    return None


def drain_kind(d: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """What a move out of service says, from the event's structured fields only (`codes`
    and the index-aligned `components`, as `platform.announce` writes them; `reason` is for
    people and never read): (kind, code, component). A drain for a problem found, or for a
    GPU that did not answer (`CHECK_TIMEOUT` on `gpu:N`), is `drain` (hardware); one whose
    every finding is a check that could not run elsewhere is `tool_drain` (tooling). An
    event without codes (an old log's, or a move no finding explains) charges nothing: it is
    listed (`info`), and the failure falls to its own structured cause."""
    found = d.get("codes")
    comps = d.get("components")
    if not isinstance(found, list) or not found:
        return "info", None, None
    comps = comps if isinstance(comps, list) else []
    pairs = [(str(c), str(comps[i]) if i < len(comps) else "") for i, c in enumerate(found)]
    for code, comp in pairs:
        if code not in codes.COULD_NOT_RUN or (code == HUNG and comp.startswith("gpu:")):
            return "drain", code, comp or None
    code, comp = pairs[0]
    return "tool_drain", code, comp or None


def _hang(ev: Event) -> Evidence:
    """A hang record. One with a `verdict` (the watchdog's, from the ranks' collective
    sequence numbers, or the monitor's on a frozen rank) places the hang on the culprit's
    own node, and only there: a victim's record, or one that blames no rank (all ranks in
    the same collective: no `culprit_rank`, the journal drops a null), names no node, since
    the node it was written on is not the cause. An older record keeps its node."""
    d = ev.data
    text = f"hang at step {d.get('step')} ({d.get('where', '?')})"
    if not d.get("verdict"):
        return Evidence(ev.ts, HANG, text, ev.node)
    blamed = d.get("culprit_rank")
    if d.get("culprit") is True:
        return Evidence(
            ev.ts, HANG, f"{text}: rank {d.get('rank')} on {ev.node} is the culprit", ev.node,
            strong=True,
        )  # fmt: skip
    if blamed is None:
        return Evidence(ev.ts, HANG, f"{text}: no rank is blamed ({d.get('verdict_text', '')})")
    return Evidence(ev.ts, HANG, f"{text}: rank {d.get('rank')} waited for rank {blamed}")


def _hang_rule(f: Failure, ev: list[Evidence]) -> tuple[float, Evidence] | None:
    """The culprit's own record first (it names its node), then the closest in time."""
    hits = _pick(ev, HANG)
    if not hits:
        return None
    best = min(hits, key=lambda e: (not e.strong, abs(e.ts - f.ts)))
    return 0.75, best


def _pick(items: list[Evidence], kind: str) -> list[Evidence]:
    return [e for e in items if e.kind == kind]


def _hardware(f: Failure, ev: list[Evidence]) -> tuple[float, Evidence] | None:
    hw = _pick(ev, HARDWARE)
    if not hw:
        return None
    # Prefer the blamed node, then severe findings, then one placed on a GPU (a finding on
    # a bus address or the node names less), then the one closest to the failure.
    best = min(hw, key=lambda e: (e.node != f.node, not e.strong,
                                  not (e.component or "").startswith("gpu:"),
                                  abs(e.ts - f.ts)))  # fmt: skip
    conf = 0.9 if best.strong else 0.7
    if best.ts > f.ts:
        conf -= 0.1  # seen only after the crash: likely, not proven, the cause
    if f.node is not None and best.node == f.node:
        conf += 0.05
    return min(conf, 0.95), best


def _simple(kind: str, conf: float):  # type: ignore[no-untyped-def]
    def rule(f: Failure, ev: list[Evidence]) -> tuple[float, Evidence] | None:
        hits = _pick(ev, kind)
        return (conf, min(hits, key=lambda e: abs(e.ts - f.ts))) if hits else None

    return rule


def _drain(kind: str, conf: float):  # type: ignore[no-untyped-def]
    def rule(f: Failure, ev: list[Evidence]) -> tuple[float, Evidence] | None:
        hits = [e for e in _pick(ev, kind) if f.node is None or e.node == f.node]
        return (conf, hits[0]) if hits else None

    return rule


# Ordered: the first rule that matches names the cause. Hardware wins over a hang because a
# failing GPU is the usual reason a collective hangs.
RULES = (
    (HARDWARE, _hardware),
    (NETWORK, _simple(NETWORK, 0.8)),
    (STORAGE, _simple(STORAGE, 0.8)),
    (HANG, _hang_rule),
    (HARDWARE, _drain("drain", 0.5)),
    # Evicted by a drain that tool breakage caused: not the job's fault, not hardware.
    (Charged.TOOLING, _drain("tool_drain", 0.5)),
)


def classify(f: Failure, evidence: Iterable[Evidence]) -> Attribution:
    """Pure: the most likely cause of one failure from the evidence around it."""
    ev = sorted(evidence, key=lambda e: e.ts)
    listed = tuple(f"{e.text} ({e.ts - f.ts:+.0f}s)" for e in ev)
    base = {"job": f.job, "ts": f.ts, "event": f.event, "evidence": listed}
    for cause, rule in RULES:
        hit = rule(f, ev)
        if hit is not None:
            conf, e = hit
            return Attribution(
                **base,
                cause=cause.value,
                confidence=round(conf, 2),
                summary=e.text,
                node=e.node,
                component=e.component,
                code=e.code,
            )
    # No evidence: the charge is the event's own structured cause, and only that (an exit
    # code or the words of `reason` are shown, never read for one). An event with none, as
    # old logs have, is unknown, and counted as such (`Attributor.without_cause`).
    charge, code = f.cause, f.exit_code
    said = f"exit code {code}" if code is not None else ""
    if charge in CHARGED:
        assert charge is not None
        return Attribution(
            **base,
            cause=charge.value,
            confidence=0.3 if charge is Charged.DRAIN else 0.7,
            summary=f.reason
            or (
                f"{said} ({exit_codes.lookup(code).meaning})"
                if code is not None
                else f.kind or charge.value
            ),
            node=f.node,
        )
    if charge is Charged.USER:
        app = _pick(ev, "app_xid")
        conf = 0.8 if app else 0.7
        text = f"{said or f.reason or charge.value}, no hardware evidence"
        if app:
            text += f"; {app[0].text}"
        return Attribution(**base, cause=charge.value, confidence=conf, summary=text, node=f.node)
    why = ", ".join(w for w in ("" if charge else "no cause recorded", said, "no evidence") if w)
    return Attribution(**base, cause=Charged.UNKNOWN.value, confidence=0.0, summary=why,
                       node=f.node)  # fmt: skip


@dataclass
class _Pending:
    failure: Failure
    nodes: frozenset[str]
    evidence: list[Evidence]


@dataclass
class Attributor:
    """Streams events; collects an Attribution for each failed or restarted job."""

    lookback_s: float = 600.0
    grace_s: float = 120.0
    keep: int = 1000  # most recent attributions kept in full; counts cover all of them
    start: float | None = None  # failures before the window are not reported
    end: float | None = None
    attributions: deque[Attribution] = field(default_factory=lambda: deque(maxlen=1000))
    by_cause: Counter[str] = field(default_factory=Counter)
    by_node: Counter[str] = field(default_factory=Counter)
    by_component: Counter[tuple[str, str]] = field(default_factory=Counter)
    total: int = 0
    without_cause: int = 0  # failures whose event carried no cause Charged knows (old logs)
    _node_ev: dict[str, deque[Evidence]] = field(default_factory=dict)
    _job_ev: dict[str, deque[Evidence]] = field(default_factory=dict)
    _job_nodes: dict[str, frozenset[str]] = field(default_factory=dict)
    _pending: deque[_Pending] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.attributions = deque(maxlen=self.keep)

    def feed(self, ev: Event) -> None:
        self._settle(ev.ts)
        if self.end is not None and ev.ts > self.end + self.grace_s:
            return
        if ev.kind == Kind.JOB_START and ev.job is not None:
            nodes = ev.data.get("nodes")
            names = [n for n in nodes if isinstance(n, str)] if isinstance(nodes, list) else []
            self._job_nodes[ev.job] = frozenset(names)
            self._job_ev[ev.job] = deque(maxlen=32)
            if len(self._job_nodes) > 100_000:  # jobs that never ended
                old = next(iter(self._job_nodes))
                self._job_nodes.pop(old)
                self._job_ev.pop(old, None)
            return
        if ev.kind in (Kind.JOB_RESTART, Kind.JOB_END):
            self._on_failure(ev)
            return
        e = to_evidence(ev)
        if e is None:
            return
        if ev.job is not None and ev.job in self._job_ev:
            self._job_ev[ev.job].append(e)
        elif ev.node is not None:
            self._node_ev.setdefault(ev.node, deque(maxlen=32)).append(e)
        for p in self._pending:
            if ev.job == p.failure.job or (ev.node is not None and ev.node in p.nodes):
                p.evidence.append(e)

    def _on_failure(self, ev: Event) -> None:
        job, d = ev.job or "?", ev.data
        exit_code = d.get("exit_code")
        exit_code = exit_code if type(exit_code) is int else None
        if ev.kind == Kind.JOB_END:
            ok = d.get("result", "succeeded" if exit_code in (0, None) else "failed")
            # An attempt that exits with a code the table retries for free (drained, a node
            # refused) is followed by a restart of the same job: keep what the job ran on.
            retried = exit_code is not None and exit_codes.lookup(exit_code).retry is Retry.IGNORE
            take = self._job_nodes.get if retried else self._job_nodes.pop
            nodes = take(job, frozenset())
            job_ev = (self._job_ev.get if retried else self._job_ev.pop)(job, deque())
            # A drained attempt's end is no verdict (`slo.interrupted`): the restart that
            # follows carries the drain, so one interruption is attributed once.
            if ok in ("succeeded", "cancelled") or interrupted(str(ok), exit_code):
                return
        else:
            nodes = self._job_nodes.get(job, frozenset())
            job_ev = self._job_ev.get(job, deque())
        blamed = d.get("node") if isinstance(d.get("node"), str) else ev.node
        if blamed:
            nodes = nodes | {blamed}
        if (self.start is not None and ev.ts < self.start) or (
            self.end is not None and ev.ts > self.end
        ):
            return
        since = ev.ts - self.lookback_s
        evidence = [e for e in job_ev if e.ts >= since]
        for n in nodes:
            evidence.extend(e for e in self._node_ev.get(n, ()) if e.ts >= since)
        cause = d.get("cause")
        known = cause in set(exit_codes.FAILURES)
        f = Failure(
            ev.ts,
            job,
            ev.kind,
            blamed,
            exit_code,
            str(d.get("reason", d.get("result", ""))),
            Charged(cause) if known else None,
            str(d.get("kind") or ""),
        )
        self._pending.append(_Pending(f, nodes, evidence))

    def _settle(self, now: float) -> None:
        while self._pending and self._pending[0].failure.ts + self.grace_s < now:
            self._record(self._pending.popleft())

    def _record(self, p: _Pending) -> None:
        a = classify(p.failure, p.evidence)
        self.total += 1
        if p.failure.cause is None:
            self.without_cause += 1
        self.attributions.append(a)
        self.by_cause[a.cause] += 1
        if a.cause == Charged.NODE and a.node:
            self.by_node[a.node] += 1
            if a.component and a.component != "node":
                self.by_component[(a.node, a.component)] += 1

    def finish(self) -> Attributor:
        while self._pending:
            self._record(self._pending.popleft())
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_cause": {c.value: self.by_cause.get(c, 0) for c in exit_codes.FAILURES},
            "without_cause": self.without_cause,
            "failures": [a.to_json() for a in self.attributions],
            "failures_listed": len(self.attributions),
        }


def attribute(events: Iterable[Event], **kw: Any) -> Attributor:
    """Attribute every failure of a time-ordered event stream."""
    a = Attributor(**kw)
    for ev in events:
        a.feed(ev)
    return a.finish()
