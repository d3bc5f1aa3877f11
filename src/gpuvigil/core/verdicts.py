"""A verdict's two scales: Status (how bad) and Action (what it calls for).

Plain enums with no pydantic, so that a command which only needs the scales (`logscan`,
the Xid catalog) starts without building the report models of `core.findings`, which
re-exports both.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    """A check's verdict. A check that could not run is FAILED, never OK."""

    OK = "OK"
    WARNING = "WARNING"
    FAILED = "FAILED"

    @property
    def rank(self) -> int:
        return _STATUS_RANK[self]

    @classmethod
    def worst(cls, statuses: Iterable[Status]) -> Status:
        return max(statuses, key=lambda s: s.rank, default=cls.OK)


_STATUS_RANK = {Status.OK: 0, Status.WARNING: 1, Status.FAILED: 2}


class Action(StrEnum):
    """What a finding calls for, in escalation order; INVESTIGATE asks for a human.

    INVESTIGATE ranks above REPLACE: when a human is needed, no automatic step should
    race them (the policy quarantines the node instead).
    """

    NONE = "NONE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    REBOOT = "REBOOT"
    REPLACE = "REPLACE"
    INVESTIGATE = "INVESTIGATE"

    @property
    def rank(self) -> int:
        return _ACTION_RANK[self]

    @classmethod
    def worst(cls, actions: Iterable[Action]) -> Action:
        return max(actions, key=lambda a: a.rank, default=cls.NONE)


_ACTION_RANK = {a: i for i, a in enumerate(Action)}
