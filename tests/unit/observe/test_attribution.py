"""Failure attribution, table-driven: events around a failure -> cause, confidence, summary."""

from __future__ import annotations

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.observe import attribution as at

from .conftest import make_event as E

START = E(0, "job.start", job="j", nodes=["node-17", "node-18"], gpus=16)
# As the launcher writes them: the code's cause (`training.lifecycle`) beside the code.
FAILED = E(1000, "job.end", job="j", result="failed", exit_code=1, cause="user_code")
KILLED = E(1000, "job.end", job="j", result="failed", exit_code=137, cause="unknown")


def R(ts: float, **data: object) -> object:
    """A job.restart whose data may carry `kind` (make_event's own `kind` is the event's)."""
    from gpuvigil.core.events import Event

    return Event(ts=ts, kind="job.restart", source="test", job="j", data=data)


def _xid(ts: float, code: str = "XID_79", node: str = "node-17", **kw) -> object:
    kw.setdefault("status", "FAILED")
    kw.setdefault("component", "gpu:3")
    return E(ts, "finding.set", node=node, code=code, **kw)


CASES = [
    # (id, events between start and failure (or after), failure, cause, confidence, summary)
    ("xid79-before", [_xid(990, fatal=True, action="RESET_GPU")], FAILED, "hardware", 0.9,
     "Xid 79 on gpu:3 of node-17"),
    ("xid79-after-within-grace", [_xid(1030, fatal=True)], FAILED, "hardware", 0.8,
     "Xid 79 on gpu:3 of node-17"),
    ("xid-non-fatal", [_xid(990, code="XID_63", action="NONE")], FAILED, "hardware", 0.7,
     "Xid 63 on gpu:3 of node-17"),
    ("ecc", [_xid(990, code="ECC_UNCORRECTED_VOLATILE", action="RESET_GPU")], FAILED,
     "hardware", 0.9, "ECC_UNCORRECTED_VOLATILE on gpu:3 of node-17"),
    ("other-node-ignored", [_xid(990, node="node-99", fatal=True)], FAILED, "user_code", 0.7,
     "exit code 1, no hardware evidence"),
    ("too-old-ignored", [_xid(100, fatal=True)], FAILED, "user_code", 0.7,
     "exit code 1, no hardware evidence"),
    ("after-grace-ignored", [_xid(1200, fatal=True)], FAILED, "user_code", 0.7,
     "exit code 1, no hardware evidence"),
    ("fabric", [E(995, "finding.set", node="node-18", code="FABRIC_PORT_DOWN",
                  component="nic:rdmap79s0")], FAILED, "network", 0.8,
     "FABRIC_PORT_DOWN on nic:rdmap79s0 of node-18"),
    ("checkpoint", [E(990, "checkpoint", job="j", step=40, result="failed")], FAILED, "storage",
     0.8, "checkpoint failed at step 40"),
    ("hang", [E(990, "hang", job="j", rank=3, step=41, where="allreduce")], KILLED, "hang", 0.75,
     "hang at step 41 (allreduce)"),
    ("hardware-beats-hang", [E(980, "hang", job="j", rank=3, step=41, where="allreduce"),
                             _xid(985, fatal=True)], KILLED, "hardware", 0.9,
     "Xid 79 on gpu:3 of node-17"),
    ("tool-breakage-is-not-hardware", [_xid(990, code="CHECK_TIMEOUT", component="node")],
     FAILED, "user_code", 0.7, "exit code 1, no hardware evidence"),
    ("the-gpu-not-the-bus-address", [_xid(990, fatal=True), _xid(995, fatal=True,
                                                                   component="pci:0000:5d:00.0")],
     FAILED, "hardware", 0.9, "Xid 79 on gpu:3 of node-17"),
    ("hung-gpu-is-hardware", [_xid(990, code="CHECK_TIMEOUT")], FAILED, "hardware", 0.7,
     "gpu:3 of node-17 hung (no answer in time)"),
    ("drain-for-a-hung-gpu", [E(985, "node.state", node="node-17", to="DRAINING",
                                reason="persisted: CHECK_TIMEOUT gpu:3",
                                codes=["CHECK_TIMEOUT"], components=["gpu:3"])],
     E(1000, "job.restart", job="j", node="node-17", exit_code=89), "hardware", 0.5,
     "node-17 -> DRAINING (persisted: CHECK_TIMEOUT gpu:3)"),
    ("app-xid-is-user-code", [_xid(990, code="XID_13")], FAILED, "user_code", 0.8,
     "exit code 1, no hardware evidence; Xid 13 on gpu:3 of node-17"),
    ("drain-only", [E(990, "node.state", node="node-18", to="DRAINING", reason="preflight",
                      codes=["DCGM_DIAG_FAIL"], components=["gpu:1"])],
     KILLED, "hardware", 0.5, "node-18 -> DRAINING (preflight)"),
    ("drain-for-tool-breakage", [_xid(980, code="CHECK_TIMEOUT", component="node"),
                                 E(985, "node.state", node="node-17", to="DRAINING",
                                   reason="CHECK_TIMEOUT on node", codes=["CHECK_TIMEOUT"],
                                   components=["node"])],
     KILLED, "tooling", 0.5, "node-17 -> DRAINING (CHECK_TIMEOUT on node)"),
    # A move out of service is read by its codes, never by the words of its reason.
    ("drain-codes-not-words", [E(990, "node.state", node="node-18", to="DRAINING",
                                 reason="persisted: CHECK_TIMEOUT on node",
                                 codes=["XID_79"], components=["gpu:2"])],
     KILLED, "hardware", 0.5, "node-18 -> DRAINING (persisted: CHECK_TIMEOUT on node)"),
    ("tool-drain-codes-not-words", [E(990, "node.state", node="node-18", to="DRAINING",
                                      reason="persisted: XID_79 gpu:2",
                                      codes=["CHECK_ERROR", "CHECK_TIMEOUT"],
                                      components=["nvml", "node"])],
     KILLED, "tooling", 0.5, "node-18 -> DRAINING (persisted: XID_79 gpu:2)"),
    ("a-real-finding-beside-a-hung-tool-is-hardware",
     [E(990, "node.state", node="node-18", to="DRAINING", reason="fatal: CHECK_TIMEOUT node",
        codes=["CHECK_TIMEOUT", "GPU_LOST"], components=["node", "gpu:5"])],
     KILLED, "hardware", 0.5, "node-18 -> DRAINING (fatal: CHECK_TIMEOUT node)"),
    # An old log's move (no codes): listed, never charged from its words.
    ("old-drain-words-are-not-read", [E(990, "node.state", node="node-18", to="DRAINING",
                                        reason="persisted: CHECK_TIMEOUT gpu:3 XID_79")],
     KILLED, "unknown", 0.0, "exit code 137, no evidence"),
    ("old-tool-drain-words-are-not-read", [E(990, "node.state", node="node-18", to="DRAINING",
                                             reason="CHECK_TIMEOUT on node")],
     FAILED, "user_code", 0.7, "exit code 1, no hardware evidence"),
    ("a-move-no-finding-explains", [E(990, "node.state", node="node-18", to="SUSPECT",
                                      reason="unknown: health summary stale", codes=[],
                                      components=[])],
     R(1000, cause="drain", kind="drained", exit_code=89), "drain", 0.3,
     "exit code 89 (drained: stopped on SIGTERM after saving a checkpoint)"),
    ("signal-without-evidence", [], KILLED, "unknown", 0.0, "exit code 137, no evidence"),
    # The free text is never searched for words: only the structured cause counts.
    ("reason-is-never-searched", [], E(1000, "job.end", job="j", result="failed",
                                       reason="NCCL timeout on the node's gpu"),
     "unknown", 0.0, "no cause recorded, no evidence"),
    # An old log's event without a cause: unknown (and counted), the exit code only shown.
    ("old-event-without-a-cause", [], E(1000, "job.restart", job="j", exit_code=88),
     "unknown", 0.0, "no cause recorded, exit code 88, no evidence"),
    # A detail is no cause: `frozen` is a kind under `hang`.
    ("a-kind-is-not-a-cause", [], R(1000, cause="frozen", reason="frozen: rank 1"),
     "unknown", 0.0, "no cause recorded, no evidence"),
    ("structured-cause-frozen", [], R(1000, cause="hang", kind="frozen",
                                      reason="frozen: rank 1 on vm: no step", exit_code=-9),
     "hang", 0.7, "frozen: rank 1 on vm: no step"),
    ("structured-cause-beats-the-exit-code", [],
     R(1000, cause="storage", kind="checkpoint_failed",
       reason="checkpoint_failed: rank 0 on vm: saves failed", exit_code=1),
     "storage", 0.7, "checkpoint_failed: rank 0 on vm: saves failed"),
    ("structured-user-code", [], R(1000, cause="user_code",
                                   kind="user_code", reason="user_code: rank 0: RuntimeError"),
     "user_code", 0.7, "user_code: rank 0: RuntimeError, no hardware evidence"),
    ("an-unknown-cause-is-not-read-from-the-exit-code", [],
     R(1000, cause="unknown", kind="dead", exit_code=88),
     "unknown", 0.0, "exit code 88, no evidence"),
    ("a-victim-is-not-charged", [], R(1000, cause="unknown",
                                      kind="victim", reason="victim: rank 0", exit_code=-15),
     "unknown", 0.0, "exit code -15, no evidence"),
    ("app-xid-warning-from-the-catalog", [_xid(990, code="XID_31", status="WARNING")], FAILED,
     "user_code", 0.8, "exit code 1, no hardware evidence; Xid 31 on gpu:3 of node-17"),
    ("health-gate-refused", [], E(1000, "job.restart", job="j", exit_code=87, cause="hardware"),
     "hardware", 0.7, "exit code 87 (health gate: this node is marked unhealthy by the "
     "gpuvigil agent)"),
    ("node-state-unknown", [], E(1000, "job.restart", job="j", exit_code=88, cause="hardware"),
     "hardware", 0.7,
     "exit code 88 (health gate: this node's gpuvigil state is missing, stale or unreadable)"),
    ("watchdog-exit", [], E(1000, "job.restart", job="j", exit_code=86, cause="hang"), "hang",
     0.7,
     "exit code 86 (hang watchdog: no step completed within the timeout)"),
    ("drained-without-evidence", [], E(1000, "job.restart", job="j", exit_code=89,
                                       cause="drain"), "drain", 0.3,
     "exit code 89 (drained: stopped on SIGTERM after saving a checkpoint)"),
    ("drained-for-a-finding", [_xid(990, code="XID_48", action="RESET_GPU", fatal=True),
                               E(991, "node.state", node="node-17", to="DRAINING")],
     E(1000, "job.restart", job="j", node="node-17", exit_code=89), "hardware", 0.95,
     "Xid 48 on gpu:3 of node-17"),
    ("restart-blames-node", [_xid(990, node="node-18", code="XID_48", action="RESET_GPU"),
                             _xid(991, node="node-17", code="XID_63")],
     E(1000, "job.restart", job="j", node="node-18", reason="worker lost", lost_s=30),
     "hardware", 0.95, "Xid 48 on gpu:3 of node-18"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("between", "failure", "cause", "confidence", "summary"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_attribution(between, failure, cause, confidence, summary) -> None:
    evs = sorted([START, *between, failure], key=lambda e: e.ts)
    a = at.attribute(evs, lookback_s=600, grace_s=120)
    assert a.total == 1
    got = a.attributions[0]
    assert (got.cause, got.confidence, got.summary) == (cause, confidence, summary)
    assert got.job == "j" and got.ts == 1000
    mine = [e for e in between if e.node in (None, "node-17", "node-18") and 400 <= e.ts <= 1120]
    assert len(got.evidence) == len(mine)


def test_successful_and_cancelled_jobs_are_not_attributed() -> None:
    evs = [START, E(5, "job.end", job="j", result="succeeded"), E(6, "job.end", job="k",
           result="cancelled")]  # fmt: skip
    assert at.attribute(evs).total == 0


def test_counts_by_cause_node_and_gpu() -> None:
    evs = [
        START,
        _xid(10, fatal=True),
        E(20, "job.restart", job="j", node="node-17"),
        E(30, "job.end", job="j", result="failed", exit_code=2, cause="user_code"),
    ]
    a = at.attribute(evs, lookback_s=15, grace_s=0)
    assert a.by_cause == {"hardware": 1, "user_code": 1}
    assert a.without_cause == 1  # the restart recorded none: its Xid names it, still counted
    assert a.by_node == {"node-17": 1}
    assert a.by_component == {("node-17", "gpu:3"): 1}
    assert a.to_json()["by_cause"]["hardware"] == 1


def test_failures_outside_the_window_are_not_reported() -> None:
    evs = [START, FAILED]
    assert at.attribute(evs, start=2000).total == 0
    assert at.attribute(evs, end=500).total == 0


@pytest.mark.parametrize("code", sorted(c for c in exit_codes.TABLE if c != 0))
def test_the_table_decides_who_is_charged(code: int) -> None:
    """Each code, as training records it (`lifecycle`: the kind it saw, under a cause), is
    attributed to the cause the table charges: none the table charges to someone else is
    blamed on the user's program. A code a retry spares is recorded by the restart that
    follows (the attempt's end is no verdict)."""
    from gpuvigil.core.events import Event
    from gpuvigil.training import lifecycle

    kind = lifecycle.kind_of_exit(code)
    data = {"exit_code": code, "cause": lifecycle.cause_of(kind).value, "kind": kind}
    spared = exit_codes.lookup(code).retry is exit_codes.Retry.IGNORE
    end = Event(ts=1000, kind="job.end", source="test", job="j", data={"result": "failed", **data})
    evs = [START, end, *([R(1010, **data)] if spared else [])]
    a = at.attribute(evs)
    assert [x.event for x in a.attributions] == (["job.restart"] if spared else ["job.end"])
    assert a.attributions[0].cause == exit_codes.charged(code).value
    assert a.without_cause == 0


def test_application_xids_come_from_the_catalog() -> None:
    from gpuvigil.node.catalog.xid import load_catalog

    cat = load_catalog()
    app = {c for c in cat.codes("xid") if at.app_xid(f"XID_{c}")}
    assert {13, 31, 45} <= app
    assert 79 not in app and 48 not in app and 43 not in app  # 43: IGNORE, not the app's
    assert all(cat.rule("xid", c).outcome.action.value == "RESTART_APP" for c in app)


def test_a_state_the_controller_does_not_have_is_no_evidence() -> None:
    evs = [START, E(990, "node.state", node="node-18", to="DRAINED"), KILLED]
    got = at.attribute(evs).attributions[0]
    assert (got.cause, got.evidence) == ("unknown", ())


def test_a_drained_attempts_end_keeps_the_jobs_nodes_for_its_restart() -> None:
    """Training writes job.end (exit 89) when an attempt drains, then job.restart from the
    next attempt, naming whichever rank it was: the restart still sees the Xid on the node
    the job ran on (it was forgotten with the job.end)."""
    evs = [
        START,
        _xid(990, node="node-18", fatal=True),
        E(995, "job.end", job="j", result="failed", exit_code=89),
        E(1040, "job.restart", job="j", node="node-17", exit_code=89, cause="drain"),
    ]
    a = at.attribute(evs, lookback_s=600, grace_s=120)
    # The drained attempt's end is no verdict: the one interruption is its restart.
    assert [(x.event, x.cause) for x in a.attributions] == [("job.restart", "hardware")]
    assert a.attributions[0].node == "node-18"


def _hang_of(ts: float, node: str, rank: int, culprit_rank: int | None) -> object:
    """A hang record as the watchdog writes it, with its verdict (the journal drops a null
    `culprit_rank`)."""
    blamed = {} if culprit_rank is None else {"culprit_rank": culprit_rank}
    return E(ts, "hang", node=node, job="j", rank=rank, step=41, where="allreduce",
             culprit=rank == culprit_rank, **blamed,
             verdict="fabric" if culprit_rank is None else "behind",
             verdict_text="all ranks in collective #13")  # fmt: skip


def test_a_hang_is_placed_on_the_culprit_ranks_node_not_a_victims() -> None:
    # The victim's record (node-17) is the closest to the failure; the culprit's (node-18,
    # rank 1, behind its peer) names the node.
    evs = [START, _hang_of(990, "node-18", 1, 1), _hang_of(999, "node-17", 0, 1), KILLED]
    got = at.attribute(evs, lookback_s=600, grace_s=120).attributions[0]
    assert (got.cause, got.node) == ("hang", "node-18")
    assert got.summary == "hang at step 41 (allreduce): rank 1 on node-18 is the culprit"
    # Only the victim wrote (the culprit froze and wrote nothing): the victim's node is not
    # the cause, and the record says whom it waited for.
    got = at.attribute([START, _hang_of(999, "node-17", 0, 1), KILLED]).attributions[0]
    assert got.node is None and got.summary.endswith("rank 0 waited for rank 1")


def test_a_hang_that_blames_no_rank_names_no_node() -> None:
    evs = [START, _hang_of(990, "node-18", 1, None), _hang_of(991, "node-17", 0, None), KILLED]
    got = at.attribute(evs, lookback_s=600, grace_s=120).attributions[0]
    assert (got.cause, got.node) == ("hang", None)
    assert "no rank is blamed (all ranks in collective #13)" in got.summary


@pytest.mark.parametrize(
    "reason",
    ["", "CHECK_TIMEOUT on node", "persisted: CHECK_TIMEOUT gpu:3", "fatal: XID_79 gpu:3"],
)
@pytest.mark.parametrize(
    ("codes", "components", "kind"),
    [
        (["XID_79"], ["gpu:3"], "drain"),
        (["CHECK_TIMEOUT"], ["gpu:3"], "drain"),
        (["CHECK_TIMEOUT"], ["node"], "tool_drain"),
        (["DEPENDENCY_MISSING", "CHECK_ERROR"], ["nvidia-smi", "nvml"], "tool_drain"),
        (None, None, "info"),
        ([], [], "info"),
    ],
)
def test_a_moves_kind_comes_from_its_codes_never_its_reason(reason, codes, components, kind):
    data = {"to": "DRAINING", "reason": reason}
    if codes is not None:
        data |= {"codes": codes, "components": components}
    e = at.to_evidence(E(990, "node.state", node="node-17", **data))
    assert e is not None and e.kind == kind
    assert e.text == f"node-17 -> DRAINING ({reason or 'no reason'})"  # the words: shown


@pytest.mark.parametrize(
    "data",
    [
        {"codes": "XID_79", "components": "gpu:3"},  # not lists: nothing
        {"codes": [79, None], "components": None},
        {"codes": ["CHECK_TIMEOUT", "XID_79"], "components": ["gpu:1"]},  # shorter
        {"codes": [{"x": 1}], "components": [[]]},
    ],
)
def test_garbage_cause_fields_never_raise(data) -> None:
    e = at.to_evidence(E(990, "node.state", node="node-17", to="DRAINING", **data))
    assert e is not None and e.kind in ("drain", "tool_drain", "info")
