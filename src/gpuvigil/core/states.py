"""The one table of node states: the controller's policy states, and what each means for
service, disruption budgets and drains.

The controller stores and emits these (`platform.state`, the `node.state` events, the
`gpuvigil_nodes{state}` metric); layer 4 (`observe.slo`, `observe.attribution`), the alert
rules and the dashboard read them from here, never a list of their own. A test fails when
observe/, deploy/ or docs/ names a state that is not in this table.
"""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Where a node is in its remediation; see docs/controller.md for the diagram."""

    HEALTHY = "HEALTHY"  # in service (unless someone else blocks it)
    SUSPECT = "SUSPECT"  # a problem: new work blocked, running work continues
    DRAINING = "DRAINING"  # running work is being moved off
    REMEDIATING = "REMEDIATING"  # a ladder step (reset, reboot, replace) is in progress
    VALIDATING = "VALIDATING"  # preflight must pass before new work lands
    QUARANTINED = "QUARANTINED"  # needs a human: `gpuvigil release NODE`

    @property
    def disruptive(self) -> bool:
        """States that count against the disruption budget."""
        return self in (State.DRAINING, State.REMEDIATING)

    @property
    def blocks(self) -> bool:
        """New work is kept off the node."""
        return self is not State.HEALTHY

    @property
    def in_service(self) -> bool:
        return self is State.HEALTHY

    @property
    def takes_work_away(self) -> bool:
        """Running work was (or is being) moved off: an episode that reaches one of these
        is a drain; one that only blocked new work (SUSPECT) is a cordon."""
        return self in (State.DRAINING, State.REMEDIATING, State.QUARANTINED)


# Not a policy state: the `node.state` the controller emits when a node it managed is gone
# from the cluster (replaced, or deleted by someone); layer 4 stops counting it there.
REMOVED = "REMOVED"

NAMES = frozenset({*(s.value for s in State), REMOVED})  # every state name an event may carry

# How gpuvigil marks a block as its own where a scheduler keeps only a reason string (a
# Slurm drain): `gpuvigil:<state>:<step>:<code>`. The controller writes it, the agent's
# standalone Slurm drain writes it too, and only a reason that parses as one is gpuvigil's.
TAG_PREFIX = "gpuvigil:"


def tag(state: State, step: str | None, code: str) -> str:
    return f"{TAG_PREFIX}{state.value}:{step or '-'}:{code or '-'}"


def parse_tag(text: str | None) -> tuple[State, str | None, str] | None:
    """`gpuvigil:<state>:<step>:<code>` -> (state, step, code); None when not ours or garbage."""
    if not text or not text.startswith(TAG_PREFIX):
        return None
    parts = text[len(TAG_PREFIX) :].split(":")
    if len(parts) < 3:
        return None
    try:
        state = State(parts[0])
    except ValueError:
        return None
    code = ":".join(parts[2:])
    return state, None if parts[1] == "-" else parts[1], "" if code == "-" else code
