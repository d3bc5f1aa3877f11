"""Health gate: pure decision over the agent's report, fail closed on missing/stale/garbage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpuvigil.core import exit_codes
from gpuvigil.core.findings import Action, Finding, NodeReport, Status
from gpuvigil.training import health_gate
from gpuvigil.training.config import HealthGateConfig

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def report(*findings: Finding, age_s: float = 10) -> NodeReport:
    return NodeReport(node="gpu7", generated_at=NOW - timedelta(seconds=age_s), findings=findings)


def finding(status: Status, code: str = "XID_79") -> Finding:
    return Finding(
        check="xid",
        status=status,
        code=code,
        component="gpu:3",
        action=Action.RESET_GPU,
        observed_at=NOW,
    )


def decide(rep: NodeReport | None, problem: str = "", **cfg: object) -> health_gate.Verdict:
    return health_gate.decide(rep, problem, config=HealthGateConfig(**cfg), now=NOW)  # type: ignore[arg-type]


def test_healthy_node_runs() -> None:
    v = decide(report(finding(Status.OK)))
    assert v.allowed and v.exit_code == 0


def test_unhealthy_node_refuses_with_the_cause() -> None:
    v = decide(report(finding(Status.FAILED)))
    assert (v.allowed, v.exit_code) == (False, exit_codes.NODE_UNHEALTHY)
    assert "gpu7" in v.message and "XID_79 on gpu:3" in v.message


def test_a_check_that_could_not_run_also_refuses() -> None:
    v = decide(report(finding(Status.FAILED, "CHECK_TIMEOUT")))
    assert v.exit_code == exit_codes.NODE_UNHEALTHY


def test_warning_runs_unless_configured() -> None:
    assert decide(report(finding(Status.WARNING))).allowed
    assert not decide(report(finding(Status.WARNING)), refuse_on="warning").allowed


def test_missing_file_fails_closed_by_default() -> None:
    v = decide(None, "cannot read /x: No such file")
    assert (v.allowed, v.exit_code) == (False, exit_codes.NODE_STATE_UNKNOWN)
    assert "on_missing=allow" in v.message
    assert decide(None, "cannot read /x", on_missing="allow").allowed


def test_stale_report_counts_as_missing() -> None:
    v = decide(report(age_s=3600))
    assert v.exit_code == exit_codes.NODE_STATE_UNKNOWN and "stale" in v.message


def test_report_from_the_future_counts_as_missing() -> None:
    v = decide(report(age_s=-86400))
    assert v.exit_code == exit_codes.NODE_STATE_UNKNOWN and "future" in v.message


def test_read_never_raises(tmp_path: Path) -> None:
    assert health_gate.read(tmp_path / "absent")[0] is None
    garbage = tmp_path / "g.json"
    garbage.write_bytes(b"\x00{not json")
    rep, why = health_gate.read(garbage)
    assert rep is None and "not a gpuvigil NodeReport" in why
    good = tmp_path / "r.json"
    good.write_text(report(finding(Status.FAILED)).model_dump_json())
    rep, why = health_gate.read(good)
    assert rep is not None and why == "" and rep.status is Status.FAILED


def test_disabled_gate_allows(tmp_path: Path) -> None:
    cfg = HealthGateConfig(enabled=False, state_file=tmp_path / "absent")
    assert health_gate.check(cfg, now=NOW).allowed
