"""The policy state machine, edge by edge (table-driven)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import CANNOT_RUN, FATAL, INVESTIGATE, NONFATAL, REPLACE, T0, finding, view

from gpuvigil.core.findings import Action
from gpuvigil.platform.policy import Fleet, OpKind, PolicyConfig, decide, release
from gpuvigil.platform.state import AgentResult, Preflight, Record, State

CFG = PolicyConfig()
# The breaker holds a signature: a dropped binary (nvml fails closed), a bad driver (Xid 79)
TOOL = Fleet(held=frozenset({("nvml", "DEPENDENCY_MISSING")}), held_reason="holds nvml",
             breaker_open=True)  # fmt: skip
SHARE = Fleet(held=frozenset({("xid", "XID_79")}), held_reason="holds xid/XID_79",
              breaker_open=True)  # fmt: skip
SOFT = finding()  # XID_79 as a non-fatal finding: what SHARE holds, without a fatal flag
STALE = Fleet(stale="pool silent", breaker_open=True)  # the pool's reports are stale
HUNG = finding("CHECK_TIMEOUT", action=Action.NONE, component="gpu:2", check="gpu")
OTHER_TOOL = finding("DEPENDENCY_MISSING", action=Action.NONE, component="node", check="fabric")
S = timedelta(seconds=1)


def rec(state: State, since_s: float = 0, **kw: object) -> Record:
    return Record(state=state, since=T0 - since_s * S, **kw)  # type: ignore[arg-type]


def asked(step: Action, since_s: float, **kw: object) -> Record:
    """REMEDIATING: `step` requested of the node (request "r", issued) `since_s` ago."""
    return rec(State.REMEDIATING, since_s, step=step, request_id="r", issued="r", **kw)


def kinds(d) -> list[str]:  # type: ignore[no-untyped-def]
    return [op.kind.value for op in d.ops]


CASES = [
    # (name, node, fleet, expected state, expected op kinds)
    ("healthy stays", view(), Fleet(), State.HEALTHY, []),
    ("non-fatal -> suspect, blocked", view(NONFATAL), Fleet(), State.SUSPECT, ["block"]),
    # a fatal finding blocks at once and drains `fatal_grace_s` later: a fleet-wide burst
    # is seen by the breaker before any of it is admitted
    ("fatal -> blocked", view(FATAL, running=2), Fleet(), State.SUSPECT, ["block"]),
    (
        "fatal past its grace -> draining",
        view(FATAL, record=rec(State.SUSPECT, 121), running=2),
        Fleet(),
        State.DRAINING,
        ["drain"],
    ),
    (
        "fatal held by budget",
        view(FATAL, record=rec(State.SUSPECT, 121)),
        Fleet(False, "budget"),
        State.SUSPECT,
        [],
    ),
    ("investigate blocks first", view(INVESTIGATE), Fleet(), State.SUSPECT, ["block"]),
    (
        "investigate -> quarantine after the fatal grace",
        view(INVESTIGATE, record=rec(State.SUSPECT, 121, reason="needs a human: GPU_SDC")),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    ("cannot-run blocks only", view(CANNOT_RUN), Fleet(), State.SUSPECT, ["block"]),
    (
        "suspect persists -> draining",
        view(NONFATAL, record=rec(State.SUSPECT, 601)),
        Fleet(),
        State.DRAINING,
        ["drain"],
    ),
    (
        "suspect young stays",
        view(NONFATAL, record=rec(State.SUSPECT, 10)),
        Fleet(),
        State.SUSPECT,
        [],
    ),
    (
        "cannot-run never drains",
        view(CANNOT_RUN, record=rec(State.SUSPECT, 3600)),
        Fleet(),
        State.SUSPECT,
        [],
    ),
    (
        "cannot-run quarantines when stuck",
        view(CANNOT_RUN, record=rec(State.SUSPECT, 14400)),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    ("suspect clears", view(record=rec(State.SUSPECT, 10)), Fleet(), State.HEALTHY, ["unblock"]),
    (
        "recovery while breaker open",
        view(record=rec(State.SUSPECT, 10)),
        SHARE,
        State.HEALTHY,
        ["unblock"],
    ),
    (
        "draining waits for work",
        view(FATAL, record=rec(State.DRAINING, 10), running=1),
        Fleet(),
        State.DRAINING,
        ["drain"],
    ),
    (
        "drained -> reset",
        view(FATAL, record=rec(State.DRAINING, 10, fatal=True)),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "drained, replace finding -> replace",
        view(REPLACE, record=rec(State.DRAINING, 10, fatal=True)),
        Fleet(),
        State.REMEDIATING,
        ["replace"],
    ),
    (
        "step issued: wait, no resend",
        view(FATAL, record=asked(Action.RESET_GPU, 10)),
        Fleet(),
        State.REMEDIATING,
        [],
    ),
    (
        "step not confirmed: resend same id",
        view(FATAL, record=rec(State.REMEDIATING, 10, step=Action.RESET_GPU, request_id="r")),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "reset done -> validating",
        view(
            FATAL,
            record=asked(Action.RESET_GPU, 10),
            agent_result=AgentResult("r", True),
        ),
        Fleet(),
        State.VALIDATING,
        ["revalidate"],  # preflight must run again: its pod ran when the node joined
    ),
    (
        "reset failed -> reboot",
        view(
            FATAL,
            record=asked(Action.RESET_GPU, 10),
            agent_result=AgentResult("r", False),
        ),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "reboot reported, same boot id: wait",
        view(
            FATAL,
            record=asked(Action.REBOOT, 10, boot_id="b1"),
            agent_result=AgentResult("r", True),
            boot_id="b1",
        ),
        Fleet(),
        State.REMEDIATING,
        [],
    ),
    (
        "reset timed out -> reboot",
        view(FATAL, record=asked(Action.RESET_GPU, 601)),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "replace still here after timeout -> quarantine",
        view(REPLACE, record=asked(Action.REPLACE, 3601)),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "validating: preflight pass -> healthy",
        view(
            record=rec(State.VALIDATING, 60, step=Action.RESET_GPU),
            preflight=Preflight(True, T0),
        ),
        Fleet(),
        State.HEALTHY,
        ["unblock"],
    ),
    (
        "validating: an old preflight pass does not count",
        view(
            record=rec(State.VALIDATING, 60, step=Action.RESET_GPU),
            preflight=Preflight(True, T0 - 120 * S),
        ),
        Fleet(),
        State.VALIDATING,
        ["revalidate"],  # and preflight is asked to run again (no run recorded yet)
    ),
    (
        "validating: preflight asked once per validation (restart-safe)",
        view(
            record=rec(State.VALIDATING, 60, step=Action.RESET_GPU, preflight_for=T0 - 60 * S),
            preflight=Preflight(True, T0 - 120 * S),
        ),
        Fleet(),
        State.VALIDATING,
        [],
    ),
    (
        "released node: preflight runs again",
        view(record=release(rec(State.QUARANTINED, 600), now=T0 - 5 * S)),
        Fleet(),
        State.VALIDATING,
        ["revalidate"],
    ),
    (
        "slurm (no preflight channel): nothing to trigger",
        view(
            record=rec(State.VALIDATING, 60, step=Action.RESET_GPU),
            preflight_supported=False,
            at=T0 - 120 * S,  # no summary newer than the validation yet
        ),
        Fleet(),
        State.VALIDATING,
        [],
    ),
    (
        "validating: problem back -> next step",
        view(FATAL, record=rec(State.VALIDATING, 60, step=Action.RESET_GPU)),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "validating: preflight fail after replace -> quarantine",
        view(
            record=rec(State.VALIDATING, 60, step=Action.REPLACE),
            preflight=Preflight(False, T0),
        ),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "validating, unreadable, timed out -> waits (never escalate or quarantine on unknown)",
        view(
            record=rec(State.VALIDATING, 1801, step=Action.RESET_GPU),
            health=None,
            health_error="unreadable",
        ),
        Fleet(),
        State.VALIDATING,
        [],
    ),
    (
        "new node under unvalidated taint -> validating",
        view(unvalidated=True),
        Fleet(),
        State.VALIDATING,
        ["block", "revalidate"],  # its first preflight run is started like any other
    ),
    (
        "human's cordon: left alone",
        view(FATAL, blocked_by_others=("cordon",)),
        Fleet(),
        State.HEALTHY,
        [],
    ),
    (
        "quarantine holds",
        view(record=rec(State.QUARANTINED, 10)),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "stale summary never drains",
        view(FATAL, at=T0 - 301 * S, record=rec(State.SUSPECT, 9999)),
        Fleet(),
        State.SUSPECT,
        [],
    ),
    (
        "a healthy summary dated a day ahead is not fresh: it blocks new work",
        view(at=T0 + 86400 * S),
        Fleet(),
        State.SUSPECT,
        ["block"],
    ),
    (
        "unreadable summary blocks new work",
        view(health=None, health_error="unreadable"),
        Fleet(),
        State.SUSPECT,
        ["block"],
    ),
    (
        "unreadable summary in a silent pool is not blocked",
        view(health=None, health_error="unreadable"),
        STALE,
        State.HEALTHY,
        [],
    ),
    (
        "stale for hours, alone: blocked, never quarantined",
        view(at=T0 - 99999 * S, record=rec(State.SUSPECT, 99999, reason="unknown: stale")),
        Fleet(),
        State.SUSPECT,
        [],
    ),
    (
        "silent pool: a block set for staleness alone is lifted",
        view(at=T0 - 400 * S, record=rec(State.SUSPECT, 60, reason="unknown: stale")),
        STALE,
        State.HEALTHY,
        ["unblock"],
    ),
    (
        "silent pool: a node blocked for a real finding stays blocked",
        view(FATAL, at=T0 - 400 * S, record=rec(State.SUSPECT, 99999, reason="fatal: XID_79")),
        STALE,
        State.SUSPECT,
        [],
    ),
    (
        "silent pool: a step that got no answer waits, no escalation",
        view(at=T0 - 400 * S, record=asked(Action.RESET_GPU, 601)),
        STALE,
        State.REMEDIATING,
        [],
    ),
    (
        "silent pool: a drained node takes no step",
        view(at=T0 - 400 * S, record=rec(State.DRAINING, 60, fatal=True)),
        STALE,
        State.DRAINING,
        [],
    ),
    ("absent summary (no agent yet) is left alone", view(health=None), Fleet(), State.HEALTHY, []),
    # The breaker's tool cause: could-not-run findings of a held check alone never block.
    ("held check is not blocked", view(CANNOT_RUN), TOOL, State.HEALTHY, []),
    (
        "held check: our block is lifted",
        view(CANNOT_RUN, record=rec(State.SUSPECT, 60)),
        TOOL,
        State.HEALTHY,
        ["unblock"],
    ),
    (
        "held check: no quarantine when stuck",
        view(CANNOT_RUN, record=rec(State.SUSPECT, 14400)),
        TOOL,
        State.HEALTHY,
        ["unblock"],
    ),
    (
        "held check + real fault: full ladder",
        view(CANNOT_RUN, FATAL, record=rec(State.SUSPECT, 121)),
        TOOL,
        State.DRAINING,
        ["drain"],
    ),
    ("another check is not held", view(OTHER_TOOL), TOOL, State.SUSPECT, ["block"]),
    (
        "held check while validating: the preflight pass counts",
        view(CANNOT_RUN, record=rec(State.VALIDATING, 60), preflight=Preflight(True, at=T0)),
        TOOL,
        State.HEALTHY,
        ["unblock"],
    ),
    (
        "quarantined stays with a person",
        view(CANNOT_RUN, record=rec(State.QUARANTINED, 60)),
        TOOL,
        State.QUARANTINED,
        [],
    ),
    # A held signature holds the next ladder step too; a cleared problem revalidates.
    (
        "held signature: a held real finding never validates, no escalation (blocked)",
        view(SOFT, record=rec(State.VALIDATING, 60, step=Action.RESET_GPU, request_id="r")),
        SHARE,
        State.SUSPECT,
        [],
    ),
    (
        "held signature: a failed preflight holds the next step (blocked)",
        view(
            SOFT,
            record=rec(State.VALIDATING, 60, step=Action.RESET_GPU, request_id="r"),
            preflight=Preflight(False, at=T0),
        ),
        SHARE,
        State.SUSPECT,
        [],
    ),
    (
        "held signature: a non-fatal real held finding keeps its block, never drains",
        view(SOFT, record=rec(State.SUSPECT, 9999)),
        SHARE,
        State.SUSPECT,
        [],
    ),
    (
        "held signature: a node drained before the trip waits blocked, no step",
        view(SOFT, record=rec(State.DRAINING, 60, fatal=True)),
        SHARE,
        State.SUSPECT,
        [],
    ),
    # The breaker holds remediation, never detection: a held fatal finding stays blocked,
    # off the disruption budget, with no step.
    (
        "held fatal finding: stays blocked, never drained",
        view(FATAL, record=rec(State.SUSPECT, 9999)),
        SHARE,
        State.SUSPECT,
        [],
    ),
    (
        "held fatal finding on a healthy node: blocked at once",
        view(FATAL),
        SHARE,
        State.SUSPECT,
        ["block"],
    ),
    (
        "held fatal finding after the drain: blocked, no step, off budget",
        view(FATAL, record=rec(State.DRAINING, 60, fatal=True)),
        SHARE,
        State.SUSPECT,
        [],
    ),
    (
        "held fatal finding never validates",
        view(FATAL, record=rec(State.VALIDATING, 60, step=Action.RESET_GPU, request_id="r")),
        SHARE,
        State.SUSPECT,
        [],
    ),
    (
        "quarantine rate spent: a human-needing finding waits blocked",
        view(INVESTIGATE),
        Fleet(may_quarantine=False, quarantine_why="quarantine rate limit"),
        State.SUSPECT,
        ["block"],
    ),
    (
        "quarantine rate spent: the waiting node waits on",
        view(INVESTIGATE, record=rec(State.SUSPECT, 60, reason="waiting to quarantine: x")),
        Fleet(may_quarantine=False, quarantine_why="quarantine rate limit"),
        State.SUSPECT,
        [],
    ),
    (
        "quarantine slot free: the waiting node is quarantined",
        view(INVESTIGATE, record=rec(State.SUSPECT, 60, reason="waiting to quarantine: x")),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "held signature, strict setting: blocked but never drained",
        view(FATAL, record=rec(State.SUSPECT, 9999)),
        Fleet(held=SHARE.held, held_reason="x", hold_blocks=False, breaker_open=True),
        State.SUSPECT,
        [],
    ),
    # A hung check walks the ladder (reset, then reboot); quarantine only after it failed.
    ("hung check blocks", view(HUNG), Fleet(), State.SUSPECT, ["block"]),
    (
        "hung check persists -> draining",
        view(HUNG, record=rec(State.SUSPECT, 601), running=1),
        Fleet(),
        State.DRAINING,
        ["drain"],
    ),
    (
        "hung check: drained -> reset that GPU",
        view(HUNG, record=rec(State.DRAINING, 60)),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "hung check back after the reset -> reboot",
        view(HUNG, record=rec(State.VALIDATING, 60, step=Action.RESET_GPU, request_id="r")),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "hung check back after the reboot -> quarantine (never a replacement)",
        view(HUNG, record=rec(State.VALIDATING, 60, step=Action.REBOOT, failures=1)),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "a breaker probe stops at REBOOT, and goes back to being held, never quarantined",
        view(FATAL, record=rec(State.VALIDATING, 60, step=Action.REBOOT, failures=1)),
        Fleet(max_step=Action.REBOOT),
        State.SUSPECT,
        [],
    ),
    # Replace is verified: it counts once another machine stands behind the node.
    (
        "replace: the same machine is still here -> wait",
        view(
            REPLACE,
            record=asked(Action.REPLACE, 60, provider_id="aws:///i-1"),
            provider_id="aws:///i-1",
        ),
        Fleet(),
        State.REMEDIATING,
        [],
    ),
    (
        "replace: a new machine -> validating",
        view(
            record=asked(Action.REPLACE, 60, provider_id="aws:///i-1"),
            provider_id="aws:///i-2",
        ),
        Fleet(),
        State.VALIDATING,
        ["revalidate"],
    ),
    (
        "replace: timed out with the same machine -> quarantine",
        view(
            REPLACE,
            record=asked(Action.REPLACE, 3601, boot_id="b1"),
            boot_id="b1",
        ),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "replace without a way to replace -> quarantine at once",
        view(REPLACE, record=rec(State.DRAINING, 10, fatal=True), replace_supported=False),
        Fleet(),
        State.QUARANTINED,
        [],
    ),
    (
        "the machine given back came back unchanged -> quarantine",
        view(FATAL, unvalidated=True),
        Fleet(returned="given back and came back"),
        State.QUARANTINED,
        ["block"],
    ),
    (
        "a new machine answering a replacement validates, even without the taint",
        view(),
        Fleet(replaces="n0"),
        State.VALIDATING,
        ["block", "revalidate"],
    ),
    (
        "escalation proceeds without the breaker",
        view(FATAL, record=rec(State.VALIDATING, 60, step=Action.RESET_GPU, request_id="r")),
        Fleet(),
        State.REMEDIATING,
        ["request"],
    ),
    (
        "held step whose problem cleared revalidates",
        view(
            record=rec(State.REMEDIATING, 60, step=Action.RESET_GPU, request_id="r"),
            agent_result=AgentResult(request_id="r", succeeded=False, detail="x", at=T0),
        ),
        SHARE,
        State.VALIDATING,
        ["revalidate"],  # entering VALIDATING after a repair asks for preflight again
    ),
]


@pytest.mark.parametrize(
    ("name", "node", "fleet", "state", "ops"), CASES, ids=[c[0] for c in CASES]
)
def test_edges(name: str, node, fleet, state, ops) -> None:  # type: ignore[no-untyped-def]
    d = decide(node, fleet=fleet, now=T0, config=CFG)
    assert d.state is state, d.reason
    assert kinds(d) == ops, d.reason


def test_cooldown_holds_a_new_disruption() -> None:
    r = rec(State.SUSPECT, 700, last_action_at=T0 - 60 * S)
    d = decide(view(FATAL, record=r), now=T0, config=CFG)
    assert d.state is State.SUSPECT and "cooldown" in d.held


def test_problem_back_soon_after_a_step_escalates() -> None:
    r = Record(state=State.HEALTHY, step=Action.RESET_GPU, last_step_done_at=T0 - 3600 * S)
    d = decide(view(FATAL, record=r), now=T0, config=CFG)
    assert d.state is State.SUSPECT and d.record.failures == 1
    later = T0 + 121 * S
    d2 = decide(view(FATAL, record=d.record, at=later), now=later, config=CFG)
    assert d2.state is State.DRAINING and d2.record.failures == 1
    d3 = decide(view(FATAL, record=d2.record, at=later), now=later, config=CFG)
    assert d3.state is State.REMEDIATING and d3.record.step is Action.REBOOT


def test_problem_back_long_after_starts_the_ladder_again() -> None:
    r = Record(
        state=State.HEALTHY, step=Action.REBOOT, failures=2, last_step_done_at=T0 - 2 * 86400 * S
    )
    d = decide(view(FATAL, record=r), now=T0, config=CFG)
    assert d.record.failures == 0 and d.record.step is None


def test_k_failed_steps_quarantine() -> None:
    r = asked(Action.REBOOT, 10, failures=2)
    d = decide(view(FATAL, record=r, agent_result=AgentResult("r", False)), now=T0, config=CFG)
    assert d.state is State.QUARANTINED


def test_release_validates_before_work() -> None:
    r = release(rec(State.QUARANTINED, failures=3, step=Action.REPLACE), now=T0, who="alice")
    assert r.state is State.VALIDATING and r.failures == 0 and r.step is None
    assert r.history[-1].reason == "released by alice"


def test_a_decision_that_starts_a_disruption_says_so() -> None:
    d = decide(view(FATAL), now=T0, config=PolicyConfig(fatal_grace_s=0))
    assert d.disruptive and d.store
    assert [op.kind for op in d.ops] == [OpKind.BLOCK, OpKind.DRAIN]


def test_a_hung_check_resets_the_gpu_it_names() -> None:
    d = decide(view(HUNG, FATAL, record=rec(State.DRAINING, 60, fatal=True)), now=T0, config=CFG)
    assert d.ops[0].action is Action.RESET_GPU and d.ops[0].gpus == (2, 3)


def test_a_replacement_remembers_the_machine_it_gives_back() -> None:
    node = view(REPLACE, record=rec(State.DRAINING, 10, fatal=True), provider_id="p1",
                boot_id="b1")  # fmt: skip
    d = decide(node, now=T0, config=CFG)
    assert d.record.step is Action.REPLACE
    assert (d.record.provider_id, d.record.boot_id) == ("p1", "b1")


def test_a_new_node_failing_validation_takes_budget() -> None:
    node = view(FATAL, record=rec(State.VALIDATING, 60), unvalidated=True)
    held = decide(node, fleet=Fleet(False, "budget"), now=T0, config=CFG)
    assert held.state is State.VALIDATING and held.held == "budget"
    d = decide(node, fleet=Fleet(), now=T0, config=CFG)
    assert d.state is State.REMEDIATING and d.disruptive
