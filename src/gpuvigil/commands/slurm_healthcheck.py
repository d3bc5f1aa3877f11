"""`gpuvigil slurm-healthcheck`: for Slurm's HealthCheckProgram (NHC-style sites)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuvigil import config as gconfig
from gpuvigil.commands import options
from gpuvigil.commands.npd import fresh_report, run_once
from gpuvigil.core import freshness, naming
from gpuvigil.core.cli_exit import CliExit
from gpuvigil.core.findings import Finding, Status, utcnow
from gpuvigil.node.sinks.state_file import DEFAULT_PATH

HELP = (
    "Judge this node once and drain it in Slurm on a problem, the way NHC does; meant for "
    "slurm.conf's HealthCheckProgram (runs as root on every node). Uses the gpuvigil "
    "agent's report when it is fresh (--state-file, --max-age), else runs the fast checks "
    "itself; a missing, unreadable or stale report is then a FAILED finding too (RESULT_STALE "
    "agent: the agent is not running, or cannot write its report), unless --no-agent says "
    'no agent runs here. Drains with Reason="gpuvigil:SUSPECT:-:<code> <component>" on '
    "every finding Kubernetes would block new work on (any FAILED one; --drain-on fatal: "
    "fatal ones only) and resumes the node only when it drained it itself and the finding "
    "has cleared: a person's drain is never lifted. Exit: 0 healthy, 1 unhealthy (a "
    "definite failure wins), 2 a check could not run and nothing else failed."
) + options.slurm_wrapper_help(
    "HealthCheckProgram",
    "gpuvigil-healthcheck",
    "docs/agent.md",
    more="HealthCheckInterval=300 HealthCheckNodeState=ANY",
)


def register(app: typer.Typer) -> None:
    @app.command("slurm-healthcheck", help=HELP)
    def slurm_healthcheck(  # noqa: PLR0917 - one parameter per flag is how typer declares them
        node_name: Annotated[
            str | None,
            typer.Option(
                "--node-name",
                help="Slurm node name (default $SLURMD_NODENAME, else the short host name).",
            ),
        ] = None,
        state_file: Annotated[
            Path, typer.Option("--state-file", help="The agent's report.")
        ] = DEFAULT_PATH,
        max_age: Annotated[
            float,
            typer.Option(
                "--max-age", help="Seconds: an older report is ignored and checks run here."
            ),
        ] = freshness.STATE_FILE_MAX_AGE_S,
        drain: Annotated[
            bool,
            typer.Option(
                "--drain/--no-drain", help="Drain/resume through scontrol, or only judge."
            ),
        ] = True,
        drain_on: Annotated[
            str,
            typer.Option(
                "--drain-on",
                help="blocked (default: every finding Kubernetes blocks on, core.blocking) "
                "or fatal (fatal findings only); failed is the old name of blocked.",
            ),
        ] = "blocked",
        agent: Annotated[
            bool,
            typer.Option(
                "--agent/--no-agent",
                help="An agent runs here (default): its report missing, unreadable or stale "
                "is a FAILED finding. --no-agent: judge by the checks run now only.",
            ),
        ] = True,
        config: options.ConfigFile = None,
        sysfs_root: options.SysfsRoot = None,
        expect_gpus: options.ExpectGpus = None,
    ) -> None:
        from gpuvigil.node.sinks import slurm as sl

        if drain_on not in ("blocked", "fatal", "failed"):
            typer.echo("--drain-on must be blocked or fatal", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL)
        name = naming.node_name(node_name)
        report = fresh_report(state_file, max_age_s=max_age) if agent else None
        source = f"agent report {state_file}"
        if report is None:
            report = run_once(
                config=config, sysfs_root=sysfs_root, expect_gpus=expect_gpus, names=None, node=name
            )
            source = "checks run now"
            if agent:  # the agent's silence is news: it may know what these checks cannot see
                report = report.model_copy(
                    update={"findings": (*report.findings, no_agent_report(state_file, max_age))}
                )
        for f in report.problems:
            typer.echo(f"{f.status.value} {f.code} {f.component}: {f.message}")
        if drain:
            cfg = gconfig.load(config, sections=("agent",)).agent.sinks.slurm
            cfg = cfg.model_copy(update={"drain_on": drain_on})
            try:
                did = sl.reconcile_drain(sl.SlurmNode(name, config=cfg), report, config=cfg)
            except RuntimeError as e:
                typer.echo(f"gpuvigil: scontrol failed: {e}", err=True)
                raise typer.Exit(CliExit.CANNOT_TELL) from e
            typer.echo(f"gpuvigil: {report.status.value} ({source}); slurm: {did}")
        raise typer.Exit(report.exit_code())


def no_agent_report(path: Path, max_age_s: float) -> Finding:
    """The FAILED finding for an agent report that cannot be used (say which way)."""
    from gpuvigil.node.sinks.state_file import read_report

    report = read_report(path)
    if report is not None:
        age = freshness.judge(report.generated_at, now=utcnow(), max_age_s=max_age_s)
        why = f"{age.freshness.value} ({age.describe()})"
    else:
        why = "unreadable" if path.exists() else "missing"
    return Finding(
        check="agent",
        status=Status.FAILED,
        code="RESULT_STALE",
        component="agent",
        message=f"the agent's report {path} is {why}: the agent is not running or cannot "
        "write it (a full disk); what it knows is not here",
        evidence={"state_file": str(path), "max_age_s": max_age_s},
    )
