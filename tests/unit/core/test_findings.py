from datetime import UTC, datetime

from gpuvigil.core import Action, Finding, NodeReport, Status, codes
from gpuvigil.core.wire import decode_health, encode_health


def f(code: str, status: Status = Status.FAILED, **kw: object) -> Finding:
    return Finding(check="t", status=status, code=code, **kw)  # type: ignore[arg-type]


def test_worst_status_and_action_order() -> None:
    assert Status.worst([]) is Status.OK
    assert Status.worst([Status.OK, Status.FAILED, Status.WARNING]) is Status.FAILED
    assert Action.worst([Action.REBOOT, Action.RESET_GPU]) is Action.REBOOT
    assert Action.worst([Action.REPLACE, Action.INVESTIGATE]) is Action.INVESTIGATE


def test_exit_codes() -> None:
    assert NodeReport(node="n").exit_code() == 0
    assert NodeReport(node="n", findings=(f("XID_79"),)).exit_code() == 1
    # A definite failure wins over "could not tell": it is already enough to act on.
    assert NodeReport(node="n", findings=(f("XID_79"), f("CHECK_TIMEOUT"))).exit_code() == 1
    assert NodeReport(node="n", findings=(f("CHECK_TIMEOUT"),)).exit_code() == 2
    assert NodeReport(node="n", findings=(f("DRIVER_UNAVAILABLE"), f("XID_79"))).exit_code() == 1
    only_warned = (f("CHECK_ERROR"), f("NVLINK_ERRORS", Status.WARNING))
    assert NodeReport(node="n", findings=only_warned).exit_code() == 2
    assert NodeReport(node="n", findings=(f("NVLINK_ERRORS", Status.WARNING),)).exit_code() == 0


def test_conditions_one_per_family_true_only_for_failed() -> None:
    r = NodeReport(
        node="n",
        findings=(
            f("XID_79", component="gpu:3", action=Action.REBOOT, message="fell off the bus"),
            f("XID_13", component="gpu:1", action=Action.RESTART_APP),
            f("NVLINK_ERRORS", Status.WARNING),
        ),
    )
    conds = {c.type: c for c in r.conditions}
    assert set(conds) == set(codes.FAMILIES)
    assert conds["GPUXidError"].status is True
    assert conds["GPUXidError"].reason == "XID_79"
    assert "gpu:3 XID_79" in conds["GPUXidError"].message
    assert conds["GPUInterconnectDegraded"].status is False


def test_families() -> None:
    assert codes.family_of("XID_48") == "GPUXidError"
    assert codes.family_of("SXID_20034") == "GPUInterconnectDegraded"
    assert codes.family_of("ROW_REMAP_FAILURE") == "GPUMemoryError"
    assert codes.family_of("SOMETHING_NEW") == "GPUHealthCheckFailing"


def test_report_json_roundtrip_and_wire() -> None:
    r = NodeReport(
        node="n",
        generated_at=datetime(2026, 1, 1, tzinfo=UTC),
        findings=(f("XID_79", action=Action.REBOOT, fatal=True, component="gpu:0"),),
    )
    data = r.model_dump(mode="json")
    assert data["status"] == "FAILED" and data["conditions"][0]["type"] == "GPUXidError"
    s = decode_health(encode_health(r))
    assert s is not None and s.findings[0].code == "XID_79" and s.findings[0].fatal
    assert decode_health("{not json") is None
    assert decode_health('{"v": 1}') is None
    assert decode_health(None) is None
