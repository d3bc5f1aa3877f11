"""`gpuvigil analyze PATH...`: the rules of `gpuvigil check`, over captured outputs.

For support bundles and post-mortems: any file or folder (a bundle, a tar/tar.gz of one),
each file's kind told from its content (`gpuvigil.node.capture`), an unrecognised file
named and never judged. The flags of the first version (`--kmsg`, `--nvidia-smi-xml`,
`--dcgm-*`, `--sysfs`) still work and force the kind of their file. Exit codes as `check`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer

from gpuvigil.core.cli_exit import CliExit
from gpuvigil.node.capture.kinds import kinds

if TYPE_CHECKING:
    from rich.console import Console

    from gpuvigil.node.capture.judge import Expect
    from gpuvigil.node.capture.session import InputResult
    from gpuvigil.node.config import NodeConfig

_OLD_FLAGS = {
    "kmsg": "kernel-log",
    "nvidia_smi_xml": "nvidia-smi-xml",
    "dcgm_health": "dcgmi-health",
    "dcgm_diag": "dcgmi-diag",
    "sysfs": "sysfs",
}
# The kinds every domain declares (`DOMAIN.formats`; only the specs are imported here).
_KIND_HELP = ", ".join(kinds())


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    def analyze_cmd(  # noqa: PLR0917 - typer maps every option to a parameter
        paths: Annotated[
            list[str] | None,
            typer.Argument(
                metavar="PATH...",
                help="Captured outputs: files, folders (a support bundle), tar/tar.gz "
                "archives, '-' for standard input. Each file's kind is told from its content.",
            ),
        ] = None,
        kind: Annotated[
            str | None,
            typer.Option("--kind", help=f"Take every PATH as this kind: {_KIND_HELP}."),
        ] = None,
        kmsg: Annotated[
            Path | None,
            typer.Option("--kmsg", help="A kernel log (dmesg, journalctl -k, syslog, kmsg)."),
        ] = None,
        nvidia_smi_xml: Annotated[
            Path | None,
            typer.Option(
                "--nvidia-smi-xml",
                "--nvidia-smi",
                help="`nvidia-smi -q -x` output (the `nvidia-smi -q` text is read too).",
            ),
        ] = None,
        dcgm_health: Annotated[
            Path | None,
            typer.Option("--dcgm-health", help="`dcgmi health -c [-j]` output (JSON or table)."),
        ] = None,
        dcgm_diag: Annotated[
            Path | None,
            typer.Option("--dcgm-diag", help="`dcgmi diag -r N [-j]` output (JSON or table)."),
        ] = None,
        sysfs: Annotated[
            Path | None,
            typer.Option(
                "--sysfs",
                help="A captured root holding sys/class/infiniband etc. (folder or tar.gz).",
            ),
        ] = None,
        instance_type: Annotated[
            str | None,
            typer.Option("--instance-type", help="e.g. p5.48xlarge: GPUs and adapters to expect."),
        ] = None,
        expect_gpus: Annotated[
            int | None, typer.Option("--expect-gpus", min=0, help="GPUs the node must have.")
        ] = None,
        expect_ib: Annotated[
            int | None,
            typer.Option("--expect-ib", min=0, help="InfiniBand ports the node must have."),
        ] = None,
        expect_efa: Annotated[
            int | None,
            typer.Option("--expect-efa", min=0, help="EFA devices the node must have."),
        ] = None,
        read_timeout: Annotated[
            float,
            typer.Option(
                "--read-timeout", min=0.1, help="Seconds to read one input (a FIFO, stdin)."
            ),
        ] = 30.0,
        max_bytes: Annotated[
            int,
            typer.Option("--max-bytes", min=1, help="Bytes read of one kernel log (decoded)."),
        ] = 4 * 1024**3,
        max_extract: Annotated[
            int,
            typer.Option("--max-extract", min=1, help="Bytes one archive may unpack to."),
        ] = 512 * 1024**2,
        tz: Annotated[
            str | None,
            typer.Option("--tz", help="Zone of log stamps printed without one (default: config)."),
        ] = None,
        config: Annotated[Path | None, typer.Option("--config", help="YAML config file.")] = None,
        as_json: bool = typer.Option(
            False, "--json", help="The NodeReport as JSON, plus `inputs`."
        ),
        node_name: str = typer.Option("captured", "--node", help="Node name in the report."),
    ) -> None:
        """Judge a node's captured outputs with the rules of `gpuvigil check`.

        Reads nvidia-smi (-q -x, -q, CSV, nvlink -s), dcgmi (diag, health, discovery),
        kernel logs, ibstat, ibstatus, ibv_devinfo, ibdev2netdev, fi_info and sysfs
        trees, and says what it took each file for (others are named, not judged).

        Exit: 1 a problem found (wins), 2 could not tell (an input unreadable, not
        recognised or cut at a cap), 0 healthy with every input read.

        Example: gpuvigil analyze bundle.tar.gz --instance-type p5.48xlarge
        """
        inputs = [(p, kind) for p in paths or []]
        given = {"kmsg": kmsg, "nvidia_smi_xml": nvidia_smi_xml, "dcgm_health": dcgm_health}
        given |= {"dcgm_diag": dcgm_diag, "sysfs": sysfs}
        inputs += [(str(p), _OLD_FLAGS[flag]) for flag, p in given.items() if p is not None]
        if not inputs:
            _fail("give at least one PATH (see --help)")
        if kind is not None and kind not in kinds():
            _fail(f"unknown --kind {kind!r}; one of: {', '.join(kinds())}")
        node = _node_config(config, instance_type, expect_gpus, expect_ib, expect_efa)
        try:
            zone = ZoneInfo(tz) if tz else None
        except (ZoneInfoNotFoundError, ValueError):
            _fail(f"unknown time zone {tz!r}")
        from gpuvigil.node.capture.bundle import Limits
        from gpuvigil.node.capture.session import Options, analyze
        from gpuvigil.node.checks.kernel_log.kernel_log import zone_of

        opts = Options(
            node=node,
            expect=_expect(node, expect_ib, expect_efa),
            limits=Limits(max_extract_bytes=max_extract),
            timeout_s=read_timeout,
            max_bytes=max_bytes,
            tz=zone or zone_of(node.kernel_log),
        )
        report, results = analyze(inputs, opts=opts, node_name=node_name)
        if as_json:
            doc = report.model_dump(mode="json") | {"inputs": [_input_json(r) for r in results]}
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:  # rich and the report's view only here: --json does without them (60 ms)
            from rich.console import Console

            from gpuvigil.commands import report_view

            console = Console(emoji=False, highlight=False)
            _inputs_table(results, console)
            report_view.render(report, console=console, title="gpuvigil analyze")
        raise typer.Exit(report.exit_code())


def _fail(message: str) -> None:
    typer.echo(f"gpuvigil analyze: {message}", err=True)
    raise typer.Exit(CliExit.CANNOT_TELL)


def _node_config(
    config: Path | None,
    instance_type: str | None,
    expect_gpus: int | None,
    expect_ib: int | None,
    expect_efa: int | None,
) -> NodeConfig:
    from gpuvigil import config as config_mod

    overrides: dict[str, object] = {}
    if instance_type:
        overrides["instance_type"] = instance_type
    if expect_gpus is not None:
        overrides["expect_gpus"] = expect_gpus
    # The sysfs checks read one fabric expectation: EFA when asked for, else InfiniBand.
    if expect_efa is not None or expect_ib is not None:
        efa = expect_efa is not None
        overrides["fabric"] = {
            "kind": "efa" if efa else "ib",
            "expect_adapters": expect_efa if efa else expect_ib,
        }
    try:
        cfg = config_mod.load(
            config, overrides={"node": overrides} if overrides else None, sections=("node",)
        )
    except config_mod.ConfigError as e:
        _fail(f"config error: {e}")
        raise  # unreachable: _fail exits
    return cfg.node


def _expect(node: NodeConfig, expect_ib: int | None, expect_efa: int | None) -> Expect:
    """GPUs and fabric to expect: the flags, else the config, else the instance type."""
    from gpuvigil.node import instance
    from gpuvigil.node.capture.judge import Expect
    from gpuvigil.node.checks import CheckContext
    from gpuvigil.node.checks.fabric import rules as fabric_rules
    from gpuvigil.node.checks.fabric.rules import FabricExpectation

    _, entry = instance.lookup(CheckContext(config=node, root=Path("/nonexistent")))
    gpus = node.expect_gpus if node.expect_gpus is not None else (entry[1].gpus if entry else None)
    catalog = fabric_rules.expectation(node.fabric, entry)
    ib = FabricExpectation(kind="ib", count=expect_ib, source="--expect-ib")
    efa = FabricExpectation(kind="efa", count=expect_efa, source="--expect-efa")
    return Expect(
        gpus=gpus,
        ib=ib
        if expect_ib is not None
        else catalog
        if catalog.kind == "ib"
        else FabricExpectation(),
        efa=efa
        if expect_efa is not None
        else catalog
        if catalog.kind == "efa"
        else FabricExpectation(),
    )


def _input_json(r: InputResult) -> dict[str, object]:
    kind = kinds().get(r.kind) if r.kind else None
    return {
        "path": r.path,
        "kind": r.kind,
        "taken_for": kind.what if kind else None,
        "how": r.how,
        "status": r.status.value,
    }


def _inputs_table(results: list[InputResult], console: Console) -> None:
    """What each input was taken for, laid out by `observe.terminal`: a path is never cut."""
    from gpuvigil.observe import terminal
    from gpuvigil.observe.terminal import Column, plain

    cols = (Column("input", key=True), Column("taken for"), Column("how"), Column("status"))
    rows = []
    for r in results:
        kind = kinds().get(r.kind) if r.kind else None
        rows.append([plain(r.path), plain(kind.what if kind else "-"), plain(r.how),
                     r.status.value])  # fmt: skip
    console.print(terminal.render(cols, rows, width=console.width, title="Inputs"))
