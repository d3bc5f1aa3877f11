"""`gpuvigil replay`: recorded history through a controller policy, in dry run.

Called by `commands/replay.py`. The input is either an event log (JSONL, `core.events`:
the `finding.set`/`finding.cleared` events the agents wrote) or kernel logs (one file per
node, named after it; their Xid lines are judged by the real Xid rule and catalog, through
the node pipeline, as the history goes). Each node's problems at each moment are published
on the simulator's in-memory cluster and the real controller decides, with the given
policy, budgets and breaker, as if it had been running; nothing outside this process is
touched. The answer is what it would have done: every state change, step and hold, with
its reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuvigil.core.events import Event, Kind
from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.checks.kernel_log.kernel_log_parser import scan_bytes
from gpuvigil.node.checks.kernel_log.readings import KernelLog
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline.judge import judge
from gpuvigil.observe.events import read_events
from gpuvigil.platform.clusters.memory import EPOCH
from gpuvigil.platform.controller import ControllerConfig
from gpuvigil.platform.state import LADDER
from gpuvigil.sim import replay_diff
from gpuvigil.sim.platform import Platform

# (time, node, findings now FAILED or WARNING on it): one entry per change of a node.
Change = tuple[float, str, list[Finding]]


@dataclass
class Replay:
    decisions: list[dict[str, Any]] = field(default_factory=list)
    nodes: int = 0
    changes: int = 0
    start: float | None = None
    end: float | None = None

    def counts(self) -> dict[str, int]:
        return dict(sorted(replay_diff.counts(self.decisions).items()))

    def to_json(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "changes": self.changes, "start": self.start,
                "end": self.end, "counts": self.counts(), "decisions": self.decisions}  # fmt: skip


class _Collect:
    """Takes the controller's events (it writes to anything with `write`)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self.out: list[dict[str, Any]] = []

    def write(self, ev: Event) -> None:
        if ev.kind == Kind.NODE_STATE.value and ev.data.get("from") is None:
            return  # the controller putting a node's state on record, not a decision
        self.out.append({"ts": ev.ts + self.offset, "node": ev.node, "kind": ev.kind, **ev.data})


def is_event_log(path: Path) -> bool:
    """A JSONL event log starts with a JSON object that has `kind` and `ts`."""
    try:
        with path.open("rb") as f:
            for raw in f:
                if raw.strip():
                    obj = json.loads(raw)
                    return isinstance(obj, dict) and "kind" in obj and "ts" in obj
    except (OSError, ValueError):
        return False
    return False


def fleet_from_events(paths: Iterable[Path]) -> int:
    """How many nodes the log knows (every node any event names): the fleet the recorded
    controller's budget and breaker were sized on."""
    return len({ev.node for ev in read_events([str(p) for p in paths]) if ev.node})


def changes_from_events(paths: Iterable[Path]) -> Iterator[Change]:
    """Each node's set of problems after every finding.set / finding.cleared event."""
    live: dict[str, dict[tuple[str, str, str], Finding]] = {}
    for ev in read_events([str(p) for p in paths]):
        if ev.node is None or ev.kind not in (Kind.FINDING_SET, Kind.FINDING_CLEARED):
            continue
        d = ev.data
        try:
            f = Finding(check=str(d.get("check", "")), status=Status(d.get("status", "FAILED")),
                        code=str(d["code"]), component=str(d.get("component", "node")),
                        action=Action(d.get("action", "NONE")), fatal=bool(d.get("fatal")),
                        observed_at=datetime.fromtimestamp(ev.ts, UTC))  # fmt: skip
        except (KeyError, ValueError):
            continue  # an event we cannot read is not a problem we can replay
        node = live.setdefault(ev.node, {})
        if ev.kind == Kind.FINDING_SET and f.status is not Status.OK:
            node[f.key] = f
        else:
            node.pop(f.key, None)
        yield ev.ts, ev.node, list(node.values())


def changes_from_kernel_logs(paths: Iterable[Path], *, config: NodeConfig) -> Iterator[Change]:
    """Judge each node's Xid lines with the real rules at the time of every line."""
    merged: list[tuple[float, str, Any]] = []
    for p in paths:
        for ev in scan_bytes(p.read_bytes()):
            when = ev.time or (EPOCH + timedelta(seconds=ev.uptime_s or 0.0))
            merged.append((when.timestamp(), p.stem, ev))
    merged.sort(key=lambda x: (x[0], x[1]))
    seen: dict[str, list[Any]] = {}
    for ts, node, ev in merged:
        seen.setdefault(node, []).append(ev)
        now = datetime.fromtimestamp(ts, UTC)
        log = KernelLog(events=tuple(seen[node]), boot_id="replay")
        found = judge([log], config=config, now=now, check="kernel_log")
        yield ts, node, [f for f in found if f.status is not Status.OK]


def replay(
    changes: Iterable[Change],
    *,
    controller: ControllerConfig | None = None,
    steps_work: bool = False,
    fleet: int = 0,
) -> Replay:
    """Drive the real controller through `changes` (time-ordered) in virtual time.

    `steps_work`: a remediation step at least as strong as the findings ask for cures them
    (kernel logs cannot show whether it did); otherwise problems stay until the history
    clears them (event logs carry `finding.cleared`). `fleet`: the whole fleet's size when
    it is larger than the nodes in `changes` (budgets and the breaker are shares of it).
    """
    items = sorted(changes, key=lambda c: c[0])
    out = Replay(changes=len(items), nodes=len({c[1] for c in items}))
    if not items:
        return out
    t0 = items[0][0]
    out.start, out.end = t0, items[-1][0]
    sink = _Collect(offset=t0 - EPOCH.timestamp())
    cfg = controller or ControllerConfig()
    names = sorted({c[1] for c in items})
    # nodes the log names without a change still count (budgets and the breaker's
    # thresholds are shares of the fleet); what they run is not known
    names += [f"unlisted-{i}" for i in range(max(fleet - len(names), 0))]
    machines = [(name, {}, {}) for name in names]
    platform = Platform(machines=machines, config=cfg, reset_s=300.0, reboot_s=1200.0,
                        preflight_s=600.0, events=sink)  # fmt: skip
    i, wake_at = 0, None
    horizon = items[-1][0] - t0 + 6 * 3600.0  # let the last episode play out
    while True:
        next_change = items[i][0] - t0 if i < len(items) else None
        candidates = [x for x in (next_change, wake_at) if x is not None]
        if not candidates:
            break
        t = min(candidates)
        if t > horizon:
            break
        platform.at(t)
        while i < len(items) and items[i][0] - t0 <= t:
            _, node, findings = items[i]
            wanted = Action.worst(f.action for f in findings)
            fixed_by = wanted if steps_work and wanted in LADDER else None
            platform.publish(node, findings, fixed_by=fixed_by, running=False)
            if not findings:
                platform.clear(node)
            i += 1
        wake = platform.reconcile()
        for name in wake.replaced:
            platform.arrive(name)
        wake_at = wake.at
    out.decisions = sink.out
    return out
