"""The policy's values: its settings, the operations it asks for, what safety allows
(`Fleet`), the `Decision`, and how a node's health summary is judged (`assess`). Pure.

Used by the state machine in `platform.policy` (which re-exports all of it), by the
controller and by the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from gpuvigil.core import freshness
from gpuvigil.core.codes import COULD_NOT_RUN
from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.state import NodeView, Record, State


class PolicyConfig(StrictModel):
    """Timings of the state machine (seconds). Every default is explained in docs/controller.md."""

    suspect_grace_s: float = Field(600.0, ge=0)  # non-fatal problem: drain if it lasts this long
    suspect_max_s: float = Field(14400.0, gt=0)  # nothing to repair for this long: quarantine
    block_on_warning: bool = False  # WARNING findings also block new work
    heartbeat_stale_s: float = Field(300.0, gt=0)  # older summaries are unknown, not healthy
    block_unknown: bool = True  # block new work on nodes whose summary is stale/unreadable
    act_on_foreign_blocked: bool = False  # start episodes on nodes someone else blocked
    drain_timeout_s: float = Field(900.0, ge=0)  # then remaining work is removed
    reset_timeout_s: float = Field(600.0, gt=0)  # no agent answer in time = failed step
    reboot_timeout_s: float = Field(1800.0, gt=0)
    replace_timeout_s: float = Field(3600.0, gt=0)  # node still there -> quarantine
    validation_timeout_s: float = Field(1800.0, gt=0)
    escalation_window_s: float = Field(86400.0, ge=0)  # problem back within this -> next step
    max_failed_steps: int = Field(3, ge=1)  # K: then quarantine for a human
    cooldown_s: float = Field(600.0, ge=0)  # between disruptions of the same node


class OpKind(StrEnum):
    BLOCK = "block"
    UNBLOCK = "unblock"
    DRAIN = "drain"
    REQUEST = "request"
    REPLACE = "replace"
    REVALIDATE = "revalidate"  # run preflight again on a VALIDATING node (Cluster.revalidate)


@dataclass(frozen=True)
class Op:
    kind: OpKind
    action: Action | None = None
    request_id: str = ""
    gpus: tuple[int, ...] = ()
    deadline: datetime | None = None


@dataclass(frozen=True)
class Fleet:
    """What the safety layer allows this node right now (built per node by the controller)."""

    may_disrupt: bool = True  # budget left in the node's pool and an action token
    why_not: str = ""  # the reason when it may not (budget, breaker, rate limit)
    breaker_open: bool = False
    breaker_holds: bool = False  # the breaker holds disruptions: no new step, no escalation
    # Checks the breaker found failing closed fleet-wide (a broken tool, not broken GPUs):
    # their could-not-run findings alone neither block a node nor keep it blocked.
    tolerated_checks: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Decision:
    record: Record  # what to store on the node
    ops: tuple[Op, ...] = ()
    reason: str = ""  # why, for events and `gpuvigil nodes`
    store: bool = False  # the record changed and must be written first
    disruptive: bool = False  # starts a disruption (consumes budget and a rate token)
    held: str = ""  # a disruption the node needs but safety held back

    @property
    def state(self) -> State:
        return self.record.state


@dataclass(frozen=True)
class Assessment:
    """The node's health summary, judged: could we read it, and what does it call for."""

    readable: bool
    unknown_reason: str = ""  # why it is not readable
    problems: tuple[FindingSummary, ...] = field(default_factory=tuple)
    tolerated: tuple[FindingSummary, ...] = field(default_factory=tuple)  # held by the breaker

    @property
    def real(self) -> tuple[FindingSummary, ...]:
        """Problems found, as opposed to checks that could not run."""
        return tuple(p for p in self.problems if p.code not in COULD_NOT_RUN)

    @property
    def fatal(self) -> bool:
        return any(p.fatal for p in self.real)

    @property
    def action(self) -> Action:
        return Action.worst(p.action for p in self.real)

    @property
    def code(self) -> str:
        return self.problems[0].code if self.problems else ""

    @property
    def gpus(self) -> tuple[int, ...]:
        out = set()
        for p in self.real:
            kind, _, idx = p.component.partition(":")
            if kind == "gpu" and idx.isdigit():
                out.add(int(idx))
        return tuple(sorted(out))

    def describe(self) -> str:
        if not self.readable:
            return self.unknown_reason
        return ", ".join(f"{p.code} {p.component}" for p in self.problems[:3]) or "healthy"


def assess(
    node: NodeView,
    *,
    now: datetime,
    config: PolicyConfig,
    tolerated: frozenset[str] = frozenset(),
) -> Assessment:
    """`tolerated`: checks whose could-not-run findings are left out (the breaker's tool
    cause); they are kept in `Assessment.tolerated` so the reason can say so."""
    if node.health is None:
        return Assessment(False, f"health summary {node.health_error or 'absent'}")
    age = freshness.judge(node.heartbeat_at, now=now, max_age_s=config.heartbeat_stale_s)
    if not age.fresh:
        return Assessment(False, f"health summary {age.freshness} ({age.describe()})")
    bad = {Status.FAILED, Status.WARNING} if config.block_on_warning else {Status.FAILED}
    problems = [f for f in node.health.findings if f.status in bad]
    held = [f for f in problems if f.code in COULD_NOT_RUN and f.check in tolerated]
    problems = [f for f in problems if f not in held]
    problems.sort(key=lambda f: (-f.action.rank, not f.fatal, -f.status.rank, f.code))
    return Assessment(True, problems=tuple(problems), tolerated=tuple(held))
