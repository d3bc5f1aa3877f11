"""DCGM checks: `dcgmi health -c -j` (group "slow") and `dcgmi diag -r N -j` (group
"diag"), run fail-closed through `io.exec`, parsed by `probes.dcgm_health_parse` and
`probes.dcgm_parse` into a DcgmReport that the pipeline's `dcgm` rule judges.

DCGM is optional unless `node.dcgm.required` says otherwise: absent and optional is
reported as CHECK_DISABLED (the run is marked disabled), absent and required is
DEPENDENCY_MISSING. Present but failing (no host engine, a crash, a hang) is always a
failure. Called by `gpuvigil check`, the agent and preflight.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuvigil.core.findings import Finding, Status
from gpuvigil.io import exec as ex
from gpuvigil.node.checks import CheckContext, Readout, check
from gpuvigil.node.checks.dcgm.dcgm_health_parse import parse_health
from gpuvigil.node.checks.dcgm.dcgm_parse import parse_diag
from gpuvigil.node.checks.dcgm.readings import DcgmReport


def _absent(ctx: CheckContext, name: str) -> list[Finding] | None:
    cfg = ctx.config.dcgm
    if ex.resolve(cfg.binary, path=ctx.env.get("PATH")) is not None:
        return None
    if cfg.required:
        return [
            Finding(
                check=name,
                status=Status.FAILED,
                code="DEPENDENCY_MISSING",
                message=f"{cfg.binary} not found and node.dcgm.required is true",
                evidence={"need": cfg.binary},
            )
        ]
    return [
        Finding(
            check=name,
            status=Status.OK,
            code="CHECK_DISABLED",
            message=f"{cfg.binary} not installed; DCGM checks are optional here "
            "(set node.dcgm.required: true to fail instead)",
            evidence={"need": cfg.binary},
        )
    ]


def _run(
    ctx: CheckContext,
    name: str,
    *,
    argv: list[str],
    timeout_s: float,
    parse: Callable[[bytes], DcgmReport],
) -> Readout:
    absent = _absent(ctx, name)
    if absent is not None:
        return Readout(findings=tuple(absent))
    result = ex.run(argv, timeout_s=timeout_s, env=ctx.env)
    failure = ex.failure_finding(result, check=name, what="dcgmi")
    # dcgmi exits non-zero when a test fails; its output is then the verdict we want,
    # unless it died on a signal or its output was cut (then it is no verdict at all).
    if failure is not None and (not result.exited or not result.stdout.strip()):
        return Readout(findings=(failure,))
    report = parse(result.stdout)
    if failure is not None and report.overall in (None, "Pass"):
        # non-zero exit and no failure in the output: not a pass
        return Readout(findings=(failure,))
    return Readout((report,))


@check(
    "dcgm_health",
    group="slow",
    interval_s=300,
    timeout_s=60,
    description="DCGM health watches (dcgmi health -c -j), per GPU and system",
)
def dcgm_health(ctx: CheckContext) -> Readout:
    cfg = ctx.config.dcgm
    argv = [cfg.binary, "health", "-c", "-j"]
    return _run(
        ctx,
        "dcgm_health",
        argv=argv,
        timeout_s=cfg.health_timeout_s,
        parse=parse_health,
    )


@check(
    "dcgm_diag",
    group="diag",
    interval_s=86400,
    timeout_s=900,
    description="DCGM diagnostics (dcgmi diag -r N -j), per test and GPU",
)
def dcgm_diag(ctx: CheckContext) -> Readout:
    cfg = ctx.config.dcgm
    argv = [cfg.binary, "diag", "-r", str(cfg.diag_level), "-j"]

    def parse(out: bytes) -> DcgmReport:
        return parse_diag(out, level=cfg.diag_level)

    return _run(ctx, "dcgm_diag", argv=argv, timeout_s=cfg.diag_timeout_s, parse=parse)
