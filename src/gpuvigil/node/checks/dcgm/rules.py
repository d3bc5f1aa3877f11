"""DCGM verdicts (health watches, diagnostics) -> findings. Pure.

Per GPU and per test: Fail is FAILED, Warn is WARNING, Skip is nothing on its own. A run
that did not complete (cut output, runtime error, unreadable status, every test skipped)
is "could not tell" (CHECK_ERROR, exit 2), never a pass, for the diagnostic and the health
report alike; any Fail read before the output broke off is kept beside it (exit 1).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.checks.dcgm.readings import DcgmReport, DcgmResult
from gpuvigil.node.pipeline.registry import Inputs, rule

# Health watch system -> what a failure there calls for.
_HEALTH_ACTION = {
    "memory": Action.RESET_GPU,
    "nvlink": Action.RESET_GPU,
    "pcie": Action.REBOOT,
    "inforom": Action.REPLACE,
    "driver": Action.REBOOT,
}


def _component(gpu: int | None) -> str:
    return "node" if gpu is None else f"gpu:{gpu}"


def _incomplete(report: DcgmReport, *, now: datetime, check: str, what: str) -> Finding:
    why = list(report.errors) or ["every test was skipped"]
    return Finding(
        check=check,
        status=Status.FAILED,
        code="CHECK_ERROR",
        message=f"{what}: " + "; ".join(why),
        evidence={"errors": why, "level": report.level, "results": len(report.results)},
        observed_at=now,
    )


def health(report: DcgmReport, *, now: datetime, check: str = "dcgm_health") -> list[Finding]:
    out = _verdicts(report, report.results, now=now, check=check)
    if not out and report.complete and report.overall in {"Fail", "Warn"}:
        out.append(
            Finding(
                check=check,
                status=Status.FAILED if report.overall == "Fail" else Status.WARNING,
                code="DCGM_HEALTH_FAIL",
                message=f"dcgmi health overall: {report.overall} (no system named)",
                action=Action.INVESTIGATE if report.overall == "Fail" else Action.NONE,
                evidence={"overall": report.overall},
                observed_at=now,
            )
        )
    if not report.complete:
        out.append(
            _incomplete(report, now=now, check=check, what="dcgmi health output could not be read")
        )
    return out


def diag(report: DcgmReport, *, now: datetime, check: str = "dcgm_diag") -> list[Finding]:
    """Every verdict that was read, and "could not tell" (CHECK_ERROR) when the run did not
    complete (runtime error, output cut short, unreadable rows, every test skipped): a
    failure parsed before the output broke off is still a failure."""
    ran = [r for r in report.results if r.result != "Skip"]
    out = _verdicts(report, ran, now=now, check=check)
    if not report.complete or not ran:
        out.append(_incomplete(report, now=now, check=check, what="dcgmi diag did not complete"))
    return out


def _verdicts(
    report: DcgmReport,
    results: list[DcgmResult] | tuple[DcgmResult, ...],
    *,
    now: datetime,
    check: str,
) -> list[Finding]:
    """One finding per GPU (or the node) with a failed or warned test / watch."""
    diag_run = report.kind == "diag"
    code = "DCGM_DIAG_FAIL" if diag_run else "DCGM_HEALTH_FAIL"
    by_gpu: dict[int | None, list[DcgmResult]] = defaultdict(list)
    for r in results:
        if r.result in {"Fail", "Warn"}:
            by_gpu[r.gpu].append(r)
    out: list[Finding] = []
    for gpu, bad in sorted(by_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        failed = [r for r in bad if r.result == "Fail"]
        if diag_run:
            action = Action.INVESTIGATE
            level = f" -r {report.level}" if report.level else ""
            message = f"dcgmi diag{level}: "
            evidence: dict[str, object] = {"tests": [_ev(r) for r in bad], "level": report.level}
        else:
            action = Action.worst(_HEALTH_ACTION.get(r.test, Action.INVESTIGATE) for r in failed)
            message = "dcgmi health: "
            evidence = {"systems": [_ev(r) for r in bad], "overall": report.overall}
        out.append(
            Finding(
                check=check,
                status=Status.FAILED if failed else Status.WARNING,
                code=code,
                component=_component(gpu),
                message=message + ", ".join(f"{r.test} {r.result.lower()}" for r in bad),
                action=action if failed else Action.NONE,
                evidence=evidence,
                observed_at=now,
            )
        )
    return out


def _ev(r: DcgmResult) -> dict[str, object]:
    return {"test": r.test, "result": r.result, "gpu": r.gpu, "info": r.info}


@rule("dcgm", reads=DcgmReport, codes=("DCGM_DIAG_FAIL", "DCGM_HEALTH_FAIL"))
def dcgm_rule(report: DcgmReport, on: Inputs) -> list[Finding]:
    """DCGM's health watches or diagnostic, per GPU and test (by the report's kind)."""
    judge = health if report.kind == "health" else diag
    return judge(report, now=on.now, check=on.check)
