"""`gpuvigil preflight`: fast node checks plus active GPU and fabric tests, in one budget.

Composes the config, calls `node.preflight.run_preflight`, prints a table or JSON and
exits 0 (passed), 1 (a problem found) or 2 (a check could not run), like `gpuvigil check`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuvigil.core.cli_exit import CliExit
from gpuvigil.core.config import ConfigError


def _render(result: Any) -> None:
    """The measurements (achieved vs expected), then the report as `gpuvigil check` shows it."""
    from gpuvigil.commands import report_view
    from gpuvigil.observe import terminal
    from gpuvigil.observe.terminal import Column, plain

    console = terminal.console()
    cols = (Column("check", key=True), Column("component", key=True), Column("metric"),
            Column("achieved", justify="right"), Column("expected", justify="right"),
            Column("status"))  # fmt: skip

    def value(x: float | None, unit: str) -> terminal.Cell:
        return "-" if x is None else plain(f"{x:.4g} {unit}".strip())

    rows = [
        [plain(m.check), plain(m.component), plain(m.metric), value(m.achieved, m.unit),
         value(m.expected, m.unit), plain(m.status if not m.code else f"{m.status} {m.code}")]
        for m in result.measurements
    ]  # fmt: skip
    if rows:
        title = "Active checks: achieved vs expected"
        console.print(terminal.render(cols, rows, width=console.width, title=title))
    report_view.render(result.report, console=console, title="gpuvigil preflight")
    verdict = "PASSED" if result.passed else "FAILED"
    devices = ", ".join(sorted(set(result.devices))) or "none"
    console.print(
        f"preflight {verdict} on {result.report.node} in {result.duration_s:.1f} s "
        f"(budget {result.budget_s:g} s; device {result.device}: {devices})"
    )


def register(app: typer.Typer) -> None:
    @app.command("preflight")
    def preflight(
        *,
        config: Annotated[
            Path | None, typer.Option("--config", "-c", help="gpuvigil YAML file.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
        device: Annotated[
            str | None,
            typer.Option("--device", help="cuda (default) or cpu: the same checks, small sizes."),
        ] = None,
        expect_gpus: Annotated[
            int | None,
            typer.Option(
                "--expect-gpus", help="GPUs this node must have (0: a node without GPUs)."
            ),
        ] = None,
        instance_type: Annotated[
            str | None,
            typer.Option("--instance-type", help="e.g. p5.48xlarge (default: detected)."),
        ] = None,
        budget_s: Annotated[
            float | None,
            typer.Option("--budget-s", help="Time budget for the whole run (default 120)."),
        ] = None,
        checks: Annotated[
            str | None,
            typer.Option(
                "--checks",
                help="Comma-separated active checks: matmul,memory,bandwidth,load,allreduce.",
            ),
        ] = None,
        skip_check: Annotated[
            list[str] | None,
            typer.Option(
                "--skip-check",
                help="A node check this run cannot do (repeat), reported CHECK_DISABLED: "
                "e.g. kernel_log in a pod without /dev/kmsg.",
            ),
        ] = None,
        skip_fast: Annotated[
            bool, typer.Option("--skip-fast", help="Only the active checks.")
        ] = False,
        master: Annotated[
            str | None,
            typer.Option(
                "--master", help="HOST:PORT of node rank 0 for the cross-node all-reduce."
            ),
        ] = None,
        nnodes: Annotated[
            int | None, typer.Option("--nnodes", help="Nodes in the all-reduce.")
        ] = None,
        node_rank: Annotated[
            int | None, typer.Option("--node-rank", help="This node's rank.")
        ] = None,
        result_file: Annotated[
            Path | None,
            typer.Option(
                "--result-file",
                help="Also write the verdict as one JSON line ({result, at, summary}) to this "
                "file; on Kubernetes /dev/termination-log, which the controller reads from "
                "the preflight pod's status.",
            ),
        ] = None,
        node_name: Annotated[
            str | None,
            typer.Option(
                "--node-name",
                help="Node name in the report (default $NODE_NAME, else the short host name).",
            ),
        ] = None,
        sysfs_root: Annotated[
            Path,
            typer.Option("--sysfs-root", help="Read sysfs and /dev below this folder."),
        ] = Path("/"),
    ) -> None:
        """Validate this node before it takes work: fast node checks, then active tests
        (matmul correctness in bf16/fp16/tf32/fp32, sustained TFLOP/s vs the GPU's peak,
        device-memory patterns, host/peer bandwidth, all-reduce bus bandwidth), all within
        one time budget. Exit 0 passed, 1 a problem found (wins over the rest), 2 a check
        could not run.

        Try it anywhere: gpuvigil preflight --device cpu --expect-gpus 0
        """
        from gpuvigil import config as config_mod
        from gpuvigil.node.preflight import node_name_of, run_preflight
        from gpuvigil.observe import terminal

        overrides: dict[str, Any] = {"node": {}, "preflight": {"active": {}}}
        if expect_gpus is not None:
            overrides["node"]["expect_gpus"] = expect_gpus
        if instance_type:
            overrides["node"]["instance_type"] = instance_type
        if device:
            overrides["preflight"]["device"] = device
        if budget_s is not None:
            overrides["preflight"]["budget_s"] = budget_s
        if skip_fast:
            overrides["preflight"]["fast_checks"] = False
        if skip_check:
            overrides["preflight"]["skip_checks"] = list(skip_check)
        if checks is not None:
            overrides["preflight"]["active"]["checks"] = [
                c.strip() for c in checks.split(",") if c.strip()
            ]
        if master:
            addr, sep, port = master.rpartition(":")
            if not sep or not addr or not port.isdigit():
                typer.echo(
                    f"gpuvigil preflight: --master wants HOST:PORT, not {master!r}", err=True
                )
                raise typer.Exit(CliExit.CANNOT_TELL)
            overrides["preflight"]["active"]["peers"] = {
                "master_addr": addr,
                "master_port": int(port),
                "nnodes": nnodes or 0,
                "node_rank": node_rank or 0,
            }
        try:
            cfg = config_mod.load(config, overrides=overrides, sections=("node", "preflight"))
        except (ConfigError, ValueError) as e:
            typer.echo(f"gpuvigil preflight: {e}", err=True)
            raise typer.Exit(CliExit.CANNOT_TELL) from e
        name = node_name_of(cfg, node_name)
        with terminal.progress(quiet=as_json) as progress:
            result = run_preflight(cfg, root=sysfs_root, node_name=name, progress=progress)
        if result_file is not None:
            try:
                result_file.write_text(json.dumps(result.verdict()) + "\n")
            except OSError as e:  # the exit status still says it all
                typer.echo(f"gpuvigil preflight: cannot write {result_file}: {e}", err=True)
        if as_json:
            typer.echo(json.dumps(result.to_json(), indent=2, default=str))
        else:
            _render(result)
        raise typer.Exit(result.report.exit_code())
