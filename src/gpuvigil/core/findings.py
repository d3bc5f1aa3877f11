"""The shared vocabulary of every layer: Status, Action, Finding, NodeReport.

Probes and rules produce Findings; the agent wraps them in a NodeReport; the controller,
the training health gate, the simulator and the reports all read these same types.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from gpuvigil.core import codes
from gpuvigil.core.cli_exit import CliExit
from gpuvigil.core.conditions import Condition, derive_conditions
from gpuvigil.core.verdicts import Action, Status


def utcnow() -> datetime:
    """The one wall clock of I/O code; pure code takes `now` as an argument instead."""
    return datetime.now(UTC)


class Finding(BaseModel):
    """One thing a check saw, with the evidence for it.

    `code` is one of `gpuvigil.core.codes` (or `XID_<n>` / `SXID_<n>`); `component` names
    the part (`node`, `gpu:3`, `nic:rdmap79s0`, `nvswitch:0`); `fatal` means the node must
    be drained now rather than only kept from new work.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: str
    status: Status
    code: str
    component: str = "node"
    message: str = ""
    action: Action = Action.NONE
    fatal: bool = False
    evidence: dict[str, Any] = Field(default_factory=dict)
    observed_at: datetime = Field(default_factory=utcnow)

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        return _without(data, ("family",))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def family(self) -> str:
        return codes.family_of(self.code)

    @property
    def key(self) -> tuple[str, str, str]:
        """Identity across sweeps: the same problem on the same part is one finding."""
        return (self.check, self.code, self.component)

    @property
    def could_not_run(self) -> bool:
        return self.code in codes.COULD_NOT_RUN


class CheckRun(BaseModel):
    """How one check ran: for staleness, durations and the `disabled` state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: str
    status: Status
    started_at: datetime
    duration_s: float
    disabled: bool = False


class NodeReport(BaseModel):
    """Everything known about one node at one moment: the unit every sink publishes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    generated_at: datetime = Field(default_factory=utcnow)
    findings: tuple[Finding, ...] = ()
    checks: tuple[CheckRun, ...] = ()
    schema_version: int = 1

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        # Serialized reports carry status/conditions for readers; they are derived again.
        return _without(data, ("status", "conditions"))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> Status:
        return Status.worst(f.status for f in self.findings)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def conditions(self) -> list[Condition]:
        return derive_conditions(self.findings)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status is not Status.OK]

    @property
    def action(self) -> Action:
        return Action.worst(f.action for f in self.problems)

    def exit_code(self) -> CliExit:
        """The CLI contract (docs/checks.md): a definite failure wins (1); otherwise a check
        that could not run or an input that could not be read is "could not tell" (2);
        healthy (0) only when every check ran and found nothing FAILED.

        A definite failure outranks "could not tell" because it is already enough to act
        on: a node with a lost GPU is unhealthy whatever the checks that timed out say.
        """
        failed = [f for f in self.findings if f.status is Status.FAILED]
        if any(not f.could_not_run for f in failed):
            return CliExit.FAILED
        return CliExit.CANNOT_TELL if failed else CliExit.OK


def _without(data: Any, keys: tuple[str, ...]) -> Any:
    """Computed fields appear in dumps; reading a dump back must not reject them."""
    if isinstance(data, dict) and any(k in data for k in keys):
        return {k: v for k, v in data.items() if k not in keys}
    return data
