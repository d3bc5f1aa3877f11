"""The policy's values: its settings, the operations it asks for, what safety allows
(`Fleet`), the `Decision`, and how a node's health summary is judged (`assess`). Pure.

Used by the state machine in `platform.policy` (which re-exports all of it), by the
controller and by the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from pydantic import Field, field_validator

from gpuvigil.core import freshness
from gpuvigil.core.blocking import blocking_statuses
from gpuvigil.core.codes import COULD_NOT_RUN, is_known
from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform import isolation
from gpuvigil.platform.state import Episode, NodeView, Record, State


class PolicyConfig(StrictModel):
    """Timings of the state machine (seconds). Every default is explained in docs/controller.md."""

    suspect_grace_s: float = Field(600.0, ge=0)  # non-fatal problem: drain if it lasts this long
    # A fatal problem blocks at once and drains this much later (an INVESTIGATE one is
    # quarantined this much later), so a fleet-wide burst is seen by the circuit breaker
    # before any of it is admitted (check + publish interval).
    fatal_grace_s: float = Field(120.0, ge=0)
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
    # Could-not-run codes that a GPU reset or a reboot cures (a hung tool or driver call):
    # when they persist they walk the ladder up to REBOOT; quarantine only after it failed.
    hung_check_codes: list[str] = Field(default_factory=lambda: ["CHECK_TIMEOUT"])
    # Machine memory (docs/controller.md): a machine with `lemon_episodes` episodes within
    # `lemon_window_s` (this one included) is replaced (quarantined for RMA where nothing
    # can replace it), whatever the ladder says; a finding back `flap_count` times within
    # `flap_window_s` is persistent (the block stays, the ladder runs); a step tried in
    # `useless_step_after` past episodes that never cured this machine is skipped.
    lemon_episodes: int = Field(3, ge=2)
    lemon_window_s: float = Field(604800.0, gt=0)
    flap_count: int = Field(3, ge=2)
    flap_window_s: float = Field(86400.0, gt=0)
    useless_step_after: int = Field(2, ge=1)
    # Findings that leave a node working but slow: a gang job runs at its slowest node's
    # speed, so a quarantined node showing one has its work moved off (drained, the node
    # stays quarantined) as soon as an idle node of its pool can take it
    # (docs/controller.md "Work on a slowed node"). Empty: work stays until a person acts.
    slowing_codes: list[str] = Field(
        default_factory=lambda: ["THERMAL_SLOWDOWN", "HW_SLOWDOWN", "POWER_BRAKE"]
    )

    @field_validator("slowing_codes")
    @classmethod
    def _known_codes(cls, codes: list[str]) -> list[str]:
        unknown = [c for c in codes if not is_known(c)]
        if unknown:  # a typo would silently leave slowed work where it is
            raise ValueError(f"unknown finding codes {unknown} (docs/checks.md lists them)")
        return codes


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
    """What safety allows this node right now (built per node by `safety.Gate`)."""

    may_disrupt: bool = True  # budget left in the node's pool and an action token
    why_not: str = ""  # the reason when it may not (budget, rate limit)
    # Findings ((check, code)) the circuit breaker holds on this node: an open signature
    # covers them (a bad change, not this machine). They start or escalate no repair, and
    # block only when they say the machine is broken (not a check that could not run,
    # `hold_blocks`); `held_reason` names the suspected change.
    held: frozenset[tuple[str, str]] = frozenset()
    held_reason: str = ""
    hold_mark: tuple[str, ...] = ()  # the holding signature, kept on the record (restarts)
    hold_blocks: bool = True
    stale: str = ""  # the node's pool is silent (the breaker's stale cause): why
    max_step: Action | None = None  # the ladder stops here (a breaker probe: REBOOT)
    returned: str = ""  # this machine was given back for replacement and came back: why
    replaces: str = ""  # this new node answers the replacement of that node
    breaker_open: bool = False  # any cause is open, here or elsewhere in the fleet
    # the machine's past episodes, from the controller's memory by provider id, when the
    # node's record does not carry them (a renamed node)
    history: tuple[Episode, ...] = ()
    may_quarantine: bool = True  # the fleet-wide quarantine rate has a slot left
    quarantine_why: str = ""  # the reason when it has not
    # An idle, fit node of this node's pool could take its work now (`safety.Gate`): only
    # then is a slowed node's work moved (`PolicyConfig.slowing_codes`); without one the
    # work would wait in the queue, which costs a gang more than running slow.
    room: bool = False


@dataclass(frozen=True)
class Decision:
    record: Record  # what to store on the node
    ops: tuple[Op, ...] = ()
    reason: str = ""  # why, for events and `gpuvigil nodes`
    store: bool = False  # the record changed and must be written first
    disruptive: bool = False  # starts a disruption (consumes budget and a rate token)
    held: str = ""  # a disruption the node needs but safety held back
    # The problems the health summary showed when this was decided (`Assessment.problems`,
    # worst first): the `node.state` event publishes their codes and components, so layer 4
    # reads why a node left service from fields, never from the words of `reason`.
    findings: tuple[FindingSummary, ...] = ()

    @property
    def state(self) -> State:
        return self.record.state


@dataclass(frozen=True)
class Assessment:
    """The node's health summary, judged: could we read it, and what does it call for."""

    readable: bool
    unknown_reason: str = ""  # why it is not readable
    problems: tuple[FindingSummary, ...] = field(default_factory=tuple)
    held: tuple[FindingSummary, ...] = field(default_factory=tuple)  # held by the breaker
    hung: tuple[FindingSummary, ...] = field(default_factory=tuple)  # problems a reboot cures

    @property
    def real(self) -> tuple[FindingSummary, ...]:
        """Problems found, as opposed to checks that could not run."""
        return tuple(p for p in self.problems if p.code not in COULD_NOT_RUN)

    @property
    def repairable(self) -> tuple[FindingSummary, ...]:
        """What a ladder step can cure: real problems and hung checks."""
        return self.real + self.hung

    @property
    def fatal(self) -> bool:
        return any(p.fatal for p in self.real)

    @property
    def held_severe(self) -> bool:
        """A held finding that says the machine is broken (any but a check that could not
        run; fatal or needing a human a fortiori): the breaker may hold its repair, never
        its block (a bad change explains the burst, not that this EFA port or GPU works;
        a switch's EFA down held on the pool left 16 broken nodes schedulable)."""
        return any(
            p.fatal or p.action is Action.INVESTIGATE or p.code not in COULD_NOT_RUN
            for p in self.held
        )

    @property
    def action(self) -> Action:
        worst = Action.worst(p.action for p in self.real)
        if self.hung and worst.rank < Action.RESET_GPU.rank:
            return Action.RESET_GPU
        return worst

    @property
    def max_step(self) -> Action | None:
        """A hung check alone is cured by a reset or a reboot, never by a new machine."""
        return Action.REBOOT if self.hung and not self.real else None

    @property
    def code(self) -> str:
        return self.problems[0].code if self.problems else ""

    def slowing(self, codes: Iterable[str]) -> tuple[FindingSummary, ...]:
        """The real problems among `codes` (the ones that slow the node's work)."""
        wanted = set(codes)
        return tuple(p for p in self.real if p.code in wanted)

    @property
    def gpus(self) -> tuple[int, ...]:
        out = set()
        for p in self.repairable:
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
    held: frozenset[tuple[str, str]] = frozenset(),
) -> Assessment:
    """`held`: findings the circuit breaker holds ((check, code)); they are left out of the
    problems and kept in `Assessment.held` so the reason can say so."""
    if node.health is None:
        return Assessment(False, f"health summary {node.health_error or 'absent'}")
    age = freshness.judge(node.heartbeat_at, now=now, max_age_s=config.heartbeat_stale_s)
    if not age.fresh:
        return Assessment(False, f"health summary {age.freshness} ({age.describe()})")
    bad = blocking_statuses(block_on_warning=config.block_on_warning)  # the one table
    problems = [f for f in node.health.findings if f.status in bad]
    gone = isolation.decode_isolation(node.isolation_text)
    if gone is not None:  # the isolated GPU's own faults are its ladder's (platform.isolation)
        problems = [f for f in problems if not isolation.handled(gone, f)]
    kept = [f for f in problems if f.status is Status.FAILED and (f.check, f.code) in held]
    problems = [f for f in problems if f not in kept]
    problems.sort(key=lambda f: (-f.action.rank, not f.fatal, -f.status.rank, f.code))
    hung = tuple(f for f in problems if f.code in config.hung_check_codes)
    return Assessment(True, problems=tuple(problems), held=tuple(kept), hung=hung)
