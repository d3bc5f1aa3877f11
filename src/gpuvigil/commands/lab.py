"""`gpuvigil lab --fault KIND`: a fault through the whole platform on real parts, on this
machine; prints the timeline (or `--json`). `--fault` again runs the next fault on the same
parts once every node is back in service."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvigil.core.cli_exit import CliExit

HELP = """Inject one fault into the whole platform running on this machine, on real parts,
and show what every part did about it, second by second.

The lab starts etcd and a real kube-apiserver, kube-scheduler and kube-controller-manager
(built once by `make kube`), registers GPU nodes (--nodes, default 3) each with its own
`gpuvigil agent` over fake GPUs and its own kernel log, runs `gpuvigil controller` for real
and a 2-rank job (the example training loop on gloo), one pod per rank, whose surviving
rank keeps its process while only a lost rank's pod is replaced on a hot spare (--restart
gang: a torchrun gang, every rank restarted), with a small kubelet that runs the pods and
carries out GPU resets and reboots. It injects the fault, follows it until the node is back
in service (or quarantined, or replaced) and the job has finished, and prints the timeline,
the ladder steps, every node's final state, the job's restarts and lost steps, and what
`gpuvigil report` says about the run.

Faults: xid48 (a GPU reset cures it), xid79 (needs a reboot), row-remap-failure (needs a new
GPU), rank-hang (a rank stops making progress), agent-stop (the node's agent dies). Give
--fault several times to run them one after another on the same parts (one start for all;
row-remap-failure, which takes its node away, goes last); each fault gets a fresh job and
its own timeline and report, and --json prints a list, one object per fault.

Exit status: 0 every fault's run settled as expected, 1 one did not (timed out, or the
job failed; the faults after it are not run), 2 the lab could not run (a part is missing:
the message names the fix).

--alerts also runs Prometheus on the shipped rules and Alertmanager (Debian's prometheus
and prometheus-alertmanager), and lists each fault's alerts: when each fired, was delivered
and was resolved, in seconds from the fault.

--workload serving also runs an inference Deployment (an HPA, a PDB of minAvailable 100%,
replicas of one GPU on the GPU nodes) that the controller's capacity gate protects; the
result's `serving` says the demand and the fewest replicas Ready (docs/serving.md).

Try it: gpuvigil lab --fault xid48
"""
HELP = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))


def render(result: dict[str, Any]) -> str:
    """The timeline and the outcome as text a person reads top to bottom."""
    from gpuvigil.lab.serving import describe

    lines = [f"gpuvigil lab: fault {result['fault']} on {result['node']}", ""]
    quiet = 0  # routine checkpoints after the first one since the last other event
    for i, e in enumerate(result["timeline"]):
        routine = (
            e["event"] == "checkpoint"
            and i
            and result["timeline"][i - 1]["event"]
            in (
                "checkpoint",
                "job_resumed",
            )
        )
        if routine:
            quiet += 1
            continue
        if quiet:
            lines.append(f"{'':>10}  ... {quiet} more checkpoint(s)")
            quiet = 0
        node = e["node"] or "-"
        lines.append(f"{e['t_s']:>8.1f}s  {e['event']:<18} {node:<10} {e['detail']}")
    if quiet:
        lines.append(f"{'':>10}  ... {quiet} more checkpoint(s)")
    job = result["job"]
    lines += [
        "",
        f"remediation steps: {', '.join(result['remediation_steps']) or 'none'}",
        "final state: " + ", ".join(f"{n} {s}" for n, s in result["final_state"].items()),
        *([describe(result["serving"])] if result.get("serving") else []),
        f"job: {'finished' if job['finished'] else job['state']}, {job['restarts']} "
        f"restart(s), lost steps {job['lost_steps']}, exit codes {job['exit_codes']}",
        *_ranks(job),
    ]
    fig = result.get("figures") or {}
    names = {"blocked_s": "blocked", "job_resumed_s": "job resumed",
             "back_in_service_s": "back in service",
             "gpu_isolated_s": "GPU isolated"}  # fmt: skip
    shown = [f"{label} {fig[k]:.1f}s" for k, label in names.items() if fig.get(k) is not None]
    if shown:
        lines.append("from the fault: " + ", ".join(shown))
    if fig.get("gpus_out") is not None:
        lines.append(f"GPUs out of service at once, at most: {fig['gpus_out']}")
    att = (result.get("report") or {}).get("attribution") or {}
    for a in att.get("failures") or []:
        lines.append(f"report: {a['event']} -> {a['cause']} ({a['confidence']}): {a['summary']}")
    for a in result.get("alerts") or []:
        at = {k: a[f"{k}_after_s"] for k in ("fired", "delivered", "resolved")}
        when = ", ".join(f"{k} {v:+.1f}s" for k, v in at.items() if v is not None)
        lines.append(f"alert: {a['name']} ({a['severity']}) {when or 'pending'}")
    if result.get("alerts") == []:
        lines.append("alerts: none fired")
    lines.append(f"took {result['duration_s']} s; files in {result['workdir']}")
    return "\n".join(lines)


def _ranks(job: dict[str, Any]) -> list[str]:
    """Which ranks kept their pod and which moved (in-process mode), one line each."""
    out = []
    for r in job.get("ranks") or []:
        if r["kept"]:
            (pod,) = r["pods"]
            out.append(f"rank {r['rank']}: kept its pod {pod['pod']} on {pod['node']} (never "
                       "stopped)")  # fmt: skip
    for m in job.get("moved") or []:
        spare = " (a hot spare)" if m["to_spare"] else ""
        out.append(f"rank {m['rank']}: moved {m['from']} -> {m['to']}{spare}, pod {m['pod']}")
    return out


def register(app: typer.Typer) -> None:
    @app.command("lab", help=HELP)
    def lab(
        *,
        fault: Annotated[
            list[str],
            typer.Option(
                "--fault",
                metavar="KIND",
                help="xid48, xid79, row-remap-failure, rank-hang, agent-stop; repeat for several.",
            ),
        ],
        on: Annotated[
            str | None,
            typer.Option(
                "--on",
                metavar="NODE",
                help="The node to break (default: a node running the job, the one "
                "broken least often).",
            ),
        ] = None,
        nodes: Annotated[int, typer.Option("--nodes", help="GPU nodes (3 to 8).")] = 3,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
        config: Annotated[
            Path | None,
            typer.Option("--config", help="YAML with a `lab:` section (intervals, job size)."),
        ] = None,
        workdir: Annotated[
            Path | None,
            typer.Option("--workdir", help="Keep the run's files (logs, events) here."),
        ] = None,
        quiet: Annotated[
            bool, typer.Option("--quiet", "-q", help="No progress lines on stderr.")
        ] = False,
        alerts: Annotated[
            bool,
            typer.Option(
                "--alerts",
                help="Also run Prometheus (the shipped rules, scraping every agent and the "
                "controller) and Alertmanager, delivering to a webhook the lab runs; each "
                "fault's record lists its alerts, measured from the fault.",
            ),
        ] = False,
        image: Annotated[
            bool,
            typer.Option(
                "--image/--no-image",
                help="Run the controller and the agents from the built image (`make "
                "image`), as their Deployment and DaemonSet do: the image's files, their "
                "users, their volumes; without the image, or with --no-image, from this "
                "machine's Python.",
            ),
        ] = True,
        restart: Annotated[
            str | None,
            typer.Option(
                "--restart",
                metavar="MODE",
                help="in-process (the default: one pod per rank, only the lost rank's pod is "
                "replaced, the others keep their processes) or gang (torchrun pods, every "
                "rank restarts); the config's `lab.restart`.",
            ),
        ] = None,
        workload: Annotated[
            str,
            typer.Option(
                "--workload",
                help="training (the job alone) or serving (also an inference Deployment "
                "behind an HPA and a PDB, which a repair must keep at its demand).",
            ),
        ] = "training",
    ) -> None:
        from gpuvigil.core import config as core_config
        from gpuvigil.lab import control_plane
        from gpuvigil.lab.config import LabConfig
        from gpuvigil.lab.run import Lab, LabError, check_faults, cleanup, interrupt_on_terminate

        if workload not in ("training", "serving"):
            typer.echo(f"gpuvigil lab: --workload {workload!r}: training or serving", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL)
        try:
            check_faults(fault)
        except LabError as e:
            typer.echo(f"gpuvigil lab: --fault: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        from gpuvigil.lab import alerting

        why = control_plane.missing() or (alerting.missing() if alerts else "")
        if why:
            typer.echo(f"gpuvigil lab: {why}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL)
        try:
            data = core_config.read_yaml(config).get("lab", {}) if config else {}
            if restart is not None:
                data = {**data, "restart": restart}
            cfg = core_config.validate(LabConfig, {**data, "nodes": nodes},
                                       source=str(config or "--nodes, --restart"))  # fmt: skip
        except core_config.ConfigError as e:
            typer.echo(f"gpuvigil lab: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        keep = workdir is not None
        folder = workdir or Path(tempfile.mkdtemp(prefix="gpuvigil-lab-"))
        try:
            say = None if quiet else (lambda msg: typer.echo(msg, err=True))
            lab_run = Lab(cfg, faults=fault, on=on, workdir=folder, progress=say, alerts=alerts,
                          image=image, workload=workload)  # fmt: skip
            interrupt_on_terminate()
            results = [r.to_json() for r in lab_run.run()]
        except LabError as e:
            typer.echo(f"gpuvigil lab: {e} (files in {folder})", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        ok = len(results) == len(fault) and all(
            r["settled"] and r["job"]["finished"] for r in results
        )
        if not keep and ok:
            cleanup(folder)
            for r in results:
                r["workdir"] = f"{folder} (removed; keep it with --workdir)"
        if as_json:
            typer.echo(json.dumps(results[0] if len(fault) == 1 else results, indent=2))
        else:
            typer.echo("\n\n".join(render(r) for r in results))
        if len(results) < len(fault):
            typer.echo(f"gpuvigil lab: not run: {', '.join(fault[len(results):])} (the "
                       "fault before did not settle)", err=True)  # fmt: skip
        raise typer.Exit(CliExit.OK if ok else CliExit.FAILED)
