"""Per-GPU isolation (platform.isolation): which faults are one GPU's, and the GPU's ladder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary, HealthSummary
from gpuvigil.node.catalog import error_counters, xid
from gpuvigil.platform import isolation as iso
from gpuvigil.platform.state import AgentResult, Record

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
LOCAL = iso.gpu_local_codes()
UUIDS = {i: f"GPU-{i:04d}" for i in range(8)}


def f(
    code: str,
    component: str = "gpu:3",
    *,
    action: Action = Action.RESET_GPU,
    status: Status = Status.FAILED,
    fatal: bool = False,
) -> FindingSummary:
    return FindingSummary(code=code, component=component, status=status, action=action, fatal=fatal)


# ---- the catalog's data ----------------------------------------------------------------


def test_catalog_marks_memory_faults_gpu_local_and_links_not():
    for code in (
        "XID_48",
        "XID_63",
        "XID_64",
        "XID_94",
        "XID_95",
        "XID_140",
        "ROW_REMAP_FAILURE",
        "ROW_REMAP_PENDING",
        "ECC_UNCORRECTED_VOLATILE",
        "RETIRED_PAGES_PENDING",
    ):
        assert code in LOCAL, code
    for code in (
        "XID_74",
        "XID_79",
        "XID_119",
        "XID_144",
        "SXID_12028",
        "NVLINK_DOWN",
        "PCIE_DEGRADED",
        "CHECK_TIMEOUT",
        "GPU_LOST",
        "ECC_DISABLED",
    ):
        assert code not in LOCAL, code


def test_device_local_is_overridable_and_family_blocks_keep_it():
    cat = xid.load_catalog(xid.CatalogOverrides(xid={74: xid.Entry(device_local=True)}))
    assert 74 in cat.device_local()
    assert 64 in xid.load_catalog().device_local("volta")  # volta patches 64, keeps the flag


def test_gpu_local_codes_must_be_finding_codes():
    data = error_counters.load().model_dump()
    data["gpu_local"] = ["ROW_REMAP_FAILURE", "NOT_A_CODE"]
    with pytest.raises(ValueError, match="NOT_A_CODE"):
        error_counters.CounterLimits.model_validate(data)


# ---- scope ----------------------------------------------------------------------------

SCOPE_CASES = [
    ("row remap failure on one GPU", [f("ROW_REMAP_FAILURE", action=Action.REPLACE)], 3),
    ("Xid 48 on one GPU", [f("XID_48", fatal=True)], 3),
    ("two findings, one GPU", [f("XID_48"), f("ROW_REMAP_PENDING")], 3),
    ("two bad GPUs", [f("XID_48"), f("XID_48", "gpu:5")], None),
    ("NVLink", [f("XID_74")], None),
    ("NVLink beside a local fault", [f("XID_48"), f("NVLINK_DOWN", "gpu:3")], None),
    ("fallen off the bus", [f("XID_79", action=Action.REBOOT)], None),
    ("unmapped PCI address", [f("XID_48", "pci:0000:3b:00.0")], None),
    ("the node", [f("DRIVER_UNAVAILABLE", "node")], None),
    ("a hung check on the GPU", [f("CHECK_TIMEOUT")], None),
    ("needs a human", [f("XID_48", action=Action.INVESTIGATE)], None),
    ("no GPU step", [f("XID_94", action=Action.RESTART_APP)], None),
    ("nothing", [], None),
]


@pytest.mark.parametrize(("case", "problems", "gpu"), SCOPE_CASES, ids=[c[0] for c in SCOPE_CASES])
def test_scope(case, problems, gpu):
    got = iso.scope(problems, local=LOCAL)
    assert (got.index if got else None) == gpu
    assert bool(iso.why_whole_node(problems, local=LOCAL)) == (gpu is None)


finding = st.builds(
    f,
    st.sampled_from(["XID_48", "ROW_REMAP_FAILURE", "XID_74", "NVLINK_DOWN", "CHECK_TIMEOUT"]),
    st.sampled_from(["gpu:0", "gpu:1", "node", "nvswitch:0", "pci:x", "gpu:"]),
    action=st.sampled_from(list(Action)),
    fatal=st.booleans(),
)


@given(st.lists(finding, max_size=6))
def test_scope_is_one_gpu_exactly_when_every_problem_is_that_gpus_local_fault(problems):
    got = iso.scope(problems, local=LOCAL)
    gpus = {iso.gpu_index(p.component) for p in problems}
    one_gpu_local = (
        bool(problems)
        and len(gpus) == 1
        and None not in gpus
        and all(p.code in LOCAL and p.action is not Action.INVESTIGATE for p in problems)
        and max(p.action.rank for p in problems) >= Action.RESET_GPU.rank
    )
    assert (got is not None) == one_gpu_local
    if got is not None:
        assert gpus == {got.index}
        assert got.action is Action.worst(p.action for p in problems)


@given(st.text(max_size=200))
def test_decode_never_raises(text):
    assert iso.decode_isolation(text) is None or isinstance(
        iso.decode_isolation(text), iso.Isolation
    )


def test_record_round_trips():
    rec = iso.Isolation(node="n1", gpu_uuid="GPU-1", index=1, since=T0, code="XID_48")
    assert iso.decode_isolation(rec.encode()) == rec
    assert iso.decode_isolation('{"node": "n1"}') is None  # no uuid, index, since


# ---- the GPU's ladder -------------------------------------------------------------------


def step(record, problems, *, now, enforced=True, holders=(), uuids=UUIDS, result=None):
    return iso.decide_gpu(
        record,
        node="n1",
        problems=problems,
        local=LOCAL,
        enforced=enforced,
        holders=holders,
        uuids=uuids,
        result=result,
        now=now,
    )


FATAL = [f("XID_48", fatal=True)]


def test_holders_evicted_after_the_grace_then_reset_then_cured():
    d = step(None, FATAL, now=T0, holders=["ml/job-0"])
    assert d.per_gpu and d.store and d.record.step == "evicting" and d.ops == ()
    assert d.record.gpu_uuid == "GPU-0003" and d.record.index == 3
    d = step(d.record, FATAL, now=T0 + timedelta(seconds=121), holders=["ml/job-0"])
    assert [(o.kind, o.holders) for o in d.ops] == [("evict", ("ml/job-0",))]
    assert not d.store  # eviction is idempotent: nothing new to remember
    d = step(d.record, FATAL, now=T0 + timedelta(seconds=130), holders=[])
    assert d.record.step == "resetting" and d.store
    (op,) = d.ops
    assert op.kind == "reset" and op.index == 3 and op.request_id == d.record.request_id
    sent = d.record.model_copy(update={"issued": op.request_id})
    assert step(sent, FATAL, now=T0 + timedelta(seconds=131)).ops == ()  # not sent twice
    ok = AgentResult(op.request_id, succeeded=True)
    d = step(sent, [], now=T0 + timedelta(seconds=160), result=ok)
    assert d.record is None and d.store and not d.escalated
    assert d.episode.outcome == "cured:RESET_GPU" and d.episode.gpu == "GPU-0003"
    assert d.episode.steps == (Action.RESET_GPU,)


def test_fault_that_persists_after_the_reset_stays_isolated_and_is_remembered():
    d = step(None, FATAL, now=T0)
    assert d.record.step == "resetting"  # nobody holds it: reset at once
    ok = AgentResult(d.record.request_id, succeeded=True)
    d = step(d.record, FATAL, now=T0 + timedelta(seconds=30), result=ok)
    assert d.record.step == "isolated" and d.per_gpu and d.episode.outcome == "gpu-isolated"
    rec = iso.remember(Record(), d.episode)
    assert rec.episodes[-1].gpu == "GPU-0003"
    later = step(d.record, FATAL, now=T0 + timedelta(days=3))
    assert later.per_gpu and not later.store and later.record == d.record  # until replaced


def test_failed_or_silent_reset_isolates():
    d = step(None, FATAL, now=T0)
    bad = AgentResult(d.record.request_id, succeeded=False, detail="nvidia-smi -r: busy")
    assert step(d.record, FATAL, now=T0, result=bad).record.step == "isolated"
    late = step(d.record, FATAL, now=T0 + timedelta(seconds=601))
    assert late.record.step == "isolated" and "timed out" in late.reason


def test_a_fault_needing_a_new_gpu_skips_the_reset():
    d = step(None, [f("ROW_REMAP_FAILURE", action=Action.REPLACE)], now=T0)
    assert d.record.step == "isolated" and d.episode.steps == () and d.ops == ()


def test_replaced_board_releases_the_isolation():
    rec = step(None, [f("ROW_REMAP_FAILURE", action=Action.REPLACE)], now=T0).record
    d = step(rec, [], now=T0 + timedelta(days=2), uuids={**UUIDS, 3: "GPU-new"})
    assert d.record is None and d.store and not d.escalated


@pytest.mark.parametrize(
    ("why", "problems", "kw"),
    [
        ("second bad GPU", [*FATAL, f("XID_48", "gpu:6")], {}),
        ("NVLink on the node", [*FATAL, f("XID_74", "gpu:1")], {}),
        ("device plugin restart", FATAL, {"enforced": False}),
        ("holders unknown", FATAL, {"holders": None}),
    ],
)
def test_live_isolation_hands_the_node_back(why, problems, kw):
    rec = step(None, FATAL, now=T0, holders=["ml/a"]).record  # evicting
    d = step(rec, problems, now=T0 + timedelta(seconds=5), **kw)
    assert d.record is None and d.store and d.escalated and not d.per_gpu, why


@pytest.mark.parametrize(
    ("why", "kw"),
    [
        ("plugin still offers the GPU", {"enforced": False}),
        ("holders unknown", {"holders": None}),
        ("uuid unknown", {"uuids": {}}),
    ],
)
def test_no_isolation_starts_when_it_cannot_be_enforced_or_verified(why, kw):
    d = step(None, FATAL, now=T0, **kw)
    assert d.record is None and not d.per_gpu and not d.store and "whole node" in d.reason, why


def test_without_gpu_hides_only_that_gpus_local_findings():
    h = HealthSummary(
        generated_at=T0,
        status=Status.FAILED,
        findings=[f("XID_48"), f("XID_74", "gpu:3"), f("XID_48", "gpu:4")],
    )
    left = iso.without_gpu(h, 3, local=LOCAL)
    assert [(x.code, x.component) for x in left.findings] == [
        ("XID_74", "gpu:3"),
        ("XID_48", "gpu:4"),
    ]
    clean = iso.without_gpu(h.model_copy(update={"findings": [f("XID_48")]}), 3, local=LOCAL)
    assert clean.findings == [] and clean.status is Status.OK


def test_the_node_policy_judges_the_node_without_the_isolated_gpus_own_faults():
    from gpuvigil.platform.policy import PolicyConfig, assess
    from gpuvigil.platform.state import NodeView

    rec = iso.Isolation(node="n1", gpu_uuid="GPU-0003", index=3, since=T0, code="XID_48")
    h = HealthSummary(
        generated_at=T0,
        status=Status.FAILED,
        findings=[f("XID_48"), f("ROW_REMAP_PENDING"), f("XID_48", "gpu:4")],
    )
    view = NodeView(
        name="n1", health=h, health_error=None, heartbeat_at=T0, isolation_text=rec.encode()
    )
    a = assess(view, now=T0, config=PolicyConfig())
    assert [(p.code, p.component) for p in a.problems] == [("XID_48", "gpu:4")]
    garbage = NodeView(
        name="n1", health=h, health_error=None, heartbeat_at=T0, isolation_text="{not json"
    )
    assert len(assess(garbage, now=T0, config=PolicyConfig()).problems) == 3  # fail closed
