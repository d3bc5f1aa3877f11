"""A transition's event names the findings behind it as fields (`platform.announce`)."""

from __future__ import annotations

from gpuvigil.core.events import MAX_CAUSE_CODES as MAX_CODES
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.announce import cause_fields
from gpuvigil.platform.policy import Decision
from gpuvigil.platform.state import Record


def _f(code: str, component: str) -> FindingSummary:
    return FindingSummary(code=code, component=component, status=Status.FAILED,
                          action=Action.RESET_GPU)  # fmt: skip


def test_codes_and_components_are_index_aligned_deduplicated_and_bounded() -> None:
    found = (_f("XID_79", "gpu:3"), _f("CHECK_TIMEOUT", "node"), _f("XID_79", "gpu:3"))
    d = Decision(Record(), reason="whatever the words", findings=found)
    assert cause_fields(d) == {"codes": ["XID_79", "CHECK_TIMEOUT"],
                               "components": ["gpu:3", "node"]}  # fmt: skip
    many = tuple(_f("XID_79", f"gpu:{i}") for i in range(MAX_CODES + 5))
    got = cause_fields(Decision(Record(), findings=many))
    assert len(got["codes"]) == len(got["components"]) == MAX_CODES
    assert cause_fields(Decision(Record())) == {"codes": [], "components": []}


def test_the_policys_decision_carries_the_summarys_problems() -> None:
    from datetime import UTC, datetime

    from gpuvigil.core.wire import HealthSummary
    from gpuvigil.platform.policy import decide
    from gpuvigil.platform.state import NodeView

    now = datetime(2026, 1, 1, tzinfo=UTC)
    xid = _f("XID_79", "gpu:3").model_copy(update={"fatal": True})
    health = HealthSummary(generated_at=now, status=Status.FAILED, findings=[xid])
    node = NodeView(name="n1", health=health, heartbeat_at=now)
    d = decide(node, now=now)
    assert d.state.value == "SUSPECT" and d.findings == (xid,)
    assert cause_fields(d) == {"codes": ["XID_79"], "components": ["gpu:3"]}
