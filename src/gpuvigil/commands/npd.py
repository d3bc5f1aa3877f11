"""`gpuvigil npd-plugin CHECK...`: a node-problem-detector custom plugin.

NPD's custom-plugin protocol: the exit status is the verdict (0 OK, 1 problem, any other:
unknown, where gpuvigil uses 2 for "a check could not run") and the first
`max_output_length` bytes of stdout (80 by default in NPD) are the condition's message.
`deploy/npd/gpuvigil-monitor.json` wires each NPD condition to one invocation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from gpuvigil import config as gconfig
from gpuvigil.commands import options
from gpuvigil.core import codes, freshness, naming
from gpuvigil.core.cli_exit import CliExit
from gpuvigil.core.findings import NodeReport, Status, utcnow

NPD_DEFAULT_MAX_OUTPUT = 80  # node-problem-detector's default max_output_length
HELP = (
    "Run the named checks once as a node-problem-detector custom plugin: exit 0 OK, 1 a "
    "problem, 2 unknown (a check could not run: timeout, missing tool, stale result).\n\nOne "
    "line on stdout, at most --max-length bytes (NPD cuts at max_output_length, 80 by "
    "default), naming the worst finding. --family keeps only findings of one condition "
    "family, so each NPD condition can own one. --from-state-file reads the gpuvigil agent's "
    "latest report instead of running checks (unknown when older than --max-age).\n\n"
    "Example: gpuvigil npd-plugin gpu --family GPUMemoryError"
)


def message(report: NodeReport, *, limit: int) -> str:
    """One line within `limit` bytes: the worst problem first, then how many more. The text
    is shortened at a word boundary (marked "...") so the count always shows whole. Pure."""
    problems = sorted(
        report.problems,
        key=lambda f: (-f.status.rank, -f.action.rank, not f.fatal, f.code, f.component),
    )
    if not problems:
        return fit("gpuvigil: healthy", limit=limit)
    worst = problems[0]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return fit(f"{worst.code} {worst.component}: {' '.join(worst.message.split())}", more,
               limit=limit)  # fmt: skip


def fit(text: str, suffix: str = "", *, limit: int) -> str:
    """`text` + `suffix` in at most `limit` bytes of UTF-8, `text` cut after its last whole
    word that fits (then "..."). Only when not even the first word and "..." fit is a word
    cut, at a character boundary (NPD keeps `limit` bytes whatever we print)."""
    size = len((text + suffix).encode())
    if size <= limit:
        return text + suffix
    mark = "..."
    for tail in (suffix, ""):
        room = limit - len(tail.encode()) - len(mark)
        words, out = text.split(" "), ""
        for w in words:
            cand = f"{out} {w}" if out else w
            if len(cand.encode()) > room:
                break
            out = cand
        if out:
            return out + mark + tail
    return text.encode()[:limit].decode("utf-8", errors="ignore")


def verdict(report: NodeReport, *, family: str | None = None) -> CliExit:
    """OK, FAILED or CANNOT_TELL (`CliExit`). With a family: a FAILED finding of another family that
    kept the checks from judging at all (no driver, a lost GPU, a check that could not
    run: the health-check family) makes this family unknown, never healthy."""
    failed = [f for f in report.findings if f.status is Status.FAILED]
    if family is not None and family != codes.HEALTH_CHECK:
        if any(f.family == family and not f.could_not_run for f in failed):
            return CliExit.FAILED
        return (
            CliExit.CANNOT_TELL
            if any(f.family in (family, codes.HEALTH_CHECK) for f in failed)
            else CliExit.OK
        )
    if any(not f.could_not_run for f in failed):
        return CliExit.FAILED
    return CliExit.CANNOT_TELL if failed else CliExit.OK


def only_family(report: NodeReport, family: str | None) -> NodeReport:
    """The findings of `family`, plus (fail closed) the FAILED health-check findings that
    say this family could not be judged; `verdict(..., family=)` reads them as unknown."""
    if family is None:
        return report
    keep = tuple(
        f
        for f in report.findings
        if f.family == family or (f.family == codes.HEALTH_CHECK and f.status is Status.FAILED)
    )
    return report.model_copy(update={"findings": keep})


def register(app: typer.Typer) -> None:
    @app.command("npd-plugin", help=HELP)
    def npd_plugin(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        checks: Annotated[
            list[str] | None,
            typer.Argument(
                help="Checks to run (e.g. gpu kernel_log fabric pcie); none: every fast check.",
                show_default=False,
            ),
        ] = None,
        family: Annotated[
            str | None,
            typer.Option(
                "--family", help=f"Only findings of this family: {', '.join(codes.FAMILIES)}."
            ),
        ] = None,
        max_length: Annotated[
            int, typer.Option("--max-length", min=8, help="Bytes of stdout NPD keeps.")
        ] = NPD_DEFAULT_MAX_OUTPUT,
        config: options.ConfigFile = None,
        sysfs_root: options.SysfsRoot = None,
        expect_gpus: options.ExpectGpus = None,
        from_state_file: Annotated[
            Path | None,
            typer.Option(
                "--from-state-file", help="Judge the agent's report in this file instead."
            ),
        ] = None,
        max_age: Annotated[
            float,
            typer.Option("--max-age", help="Seconds after which --from-state-file is unknown."),
        ] = freshness.STATE_FILE_MAX_AGE_S,
    ) -> None:
        if family is not None and family not in codes.FAMILIES:
            typer.echo(fit(f"unknown family {family!r}", limit=max_length))
            raise typer.Exit(CliExit.CANNOT_TELL)
        if from_state_file is not None:
            report = fresh_report(from_state_file, max_age_s=max_age)
            if report is None:
                typer.echo(fit(f"gpuvigil: no fresh report in {from_state_file}", limit=max_length))
                raise typer.Exit(CliExit.CANNOT_TELL)
        else:
            report = run_once(
                config=config, sysfs_root=sysfs_root, expect_gpus=expect_gpus, names=checks or None
            )
        report = only_family(report, family)
        typer.echo(message(report, limit=max_length))
        raise typer.Exit(verdict(report, family=family))


def fresh_report(path: Path, *, max_age_s: float) -> NodeReport | None:
    from gpuvigil.node.sinks.state_file import read_report

    report = read_report(path)
    if report is None:
        return None
    age = freshness.judge(report.generated_at, now=utcnow(), max_age_s=max_age_s)
    return report if age.fresh else None


def run_once(
    *,
    config: Path | None,
    sysfs_root: Path | None,
    expect_gpus: int | None,
    names: list[str] | None,
    node: str | None = None,
) -> NodeReport:
    """Load the config the way the agent does and run checks once (npd-plugin, Slurm)."""
    from gpuvigil.core.findings import Finding
    from gpuvigil.node.checks import REGISTRY, CheckContext
    from gpuvigil.node.sweep import run_sweep, select

    over: dict[str, object] = {}
    if expect_gpus is not None:
        over["node"] = {"expect_gpus": expect_gpus}
    cfg = gconfig.load(config, overrides=over, sections=("node", "agent"))
    root = sysfs_root or cfg.agent.sysfs_root
    ctx = CheckContext(config=cfg.node, root=root, env=dict(os.environ))
    name = naming.node_name(node or cfg.agent.node_name)
    specs = select(names=names) if names else select(groups=("fast",))
    report = run_sweep(ctx, node=name, specs=specs)
    unknown = [n for n in names or () if n not in REGISTRY]
    if not unknown:
        return report
    missing = tuple(
        Finding(
            check=n,
            status=Status.FAILED,
            code="DEPENDENCY_MISSING",
            message=f"no check named {n!r}; known: {', '.join(sorted(REGISTRY))}",
        )
        for n in unknown
    )  # a typo in NPD's config must not read as healthy
    return report.model_copy(update={"findings": report.findings + missing})
