"""DCGM verdicts (health watches, diagnostics) -> findings. Pure.

Per GPU and per test: Fail is FAILED, Warn is WARNING, Skip is nothing on its own. A run
that did not complete (cut output, runtime error, unreadable status, every test skipped)
is a failure of the check, never a pass: DCGM_DIAG_FAIL for a diagnostic that could not
finish, CHECK_ERROR for a health report that cannot be read.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from gpuvigil.core import codes
from gpuvigil.core.findings import Action, Finding, Status
from gpuvigil.node.pipeline.registry import Inputs, rule
from gpuvigil.node.readings import DcgmReport, DcgmResult

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


def health(report: DcgmReport, *, now: datetime, check: str = "dcgm_health") -> list[Finding]:
    if not report.complete:
        return [
            Finding(
                check=check,
                status=Status.FAILED,
                code="CHECK_ERROR",
                message="dcgmi health output could not be read: " + "; ".join(report.errors),
                evidence={"errors": list(report.errors)},
                observed_at=now,
            )
        ]
    out: list[Finding] = []
    by_gpu: dict[int | None, list[DcgmResult]] = defaultdict(list)
    for r in report.results:
        if r.result in {"Fail", "Warn", "Incomplete"}:
            by_gpu[r.gpu].append(r)
    for gpu, bad in sorted(by_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        failed = [r for r in bad if r.result != "Warn"]
        action = Action.worst(_HEALTH_ACTION.get(r.test, Action.INVESTIGATE) for r in failed)
        out.append(
            Finding(
                check=check,
                status=Status.FAILED if failed else Status.WARNING,
                code="DCGM_HEALTH_FAIL",
                component=_component(gpu),
                message="dcgmi health: " + ", ".join(f"{r.test} {r.result.lower()}" for r in bad),
                action=action if failed else Action.NONE,
                evidence={"systems": [_ev(r) for r in bad], "overall": report.overall},
                observed_at=now,
            )
        )
    if not out and report.overall in {"Fail", "Warn"}:
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
    return out


def diag(report: DcgmReport, *, now: datetime, check: str = "dcgm_diag") -> list[Finding]:
    ran = [r for r in report.results if r.result != "Skip"]
    if not report.complete or not ran:
        why = list(report.errors) or ["every test was skipped"]
        return [
            Finding(
                check=check,
                status=Status.FAILED,
                code="DCGM_DIAG_FAIL",
                message="dcgmi diag did not complete: " + "; ".join(why),
                action=Action.NONE,
                evidence={"errors": why, "level": report.level, "results": len(report.results)},
                observed_at=now,
            )
        ]
    out: list[Finding] = []
    by_gpu: dict[int | None, list[DcgmResult]] = defaultdict(list)
    for r in ran:
        if r.result in {"Fail", "Warn", "Incomplete"}:
            by_gpu[r.gpu].append(r)
    for gpu, bad in sorted(by_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        failed = [r for r in bad if r.result != "Warn"]
        out.append(
            Finding(
                check=check,
                status=Status.FAILED if failed else Status.WARNING,
                code="DCGM_DIAG_FAIL",
                component=_component(gpu),
                message=f"dcgmi diag{f' -r {report.level}' if report.level else ''}: "
                + ", ".join(f"{r.test} {r.result.lower()}" for r in bad),
                action=Action.INVESTIGATE if failed else Action.NONE,
                evidence={"tests": [_ev(r) for r in bad], "level": report.level},
                observed_at=now,
            )
        )
    return out


def _ev(r: DcgmResult) -> dict[str, object]:
    return {"test": r.test, "result": r.result, "gpu": r.gpu, "info": r.info}


@rule("dcgm", reads=DcgmReport, family=codes.HEALTH_CHECK)
def dcgm_rule(report: DcgmReport, on: Inputs) -> list[Finding]:
    """DCGM's health watches or diagnostic, per GPU and test (by the report's kind)."""
    judge = health if report.kind == "health" else diag
    return judge(report, now=on.now, check=on.check)
