"""`gpuvigil analyze`: the same rules as `gpuvigil check`, over captured files.

For support bundles and post-mortems: `nvidia-smi -q -x` output, a kernel log, `dcgmi
health`/`dcgmi diag` output (JSON or the text tables people paste into tickets) and a
captured sysfs tree. Each input becomes a CheckRun in the report, so an input that cannot
be read is a failure of that input, never a silent pass. Exit codes as `check`.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpuvigil import config as config_mod
from gpuvigil.commands import report_view
from gpuvigil.core.findings import CheckRun, Finding, NodeReport, Status, utcnow
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline.judge import judge
from gpuvigil.node.probes import kernel_log, nvidia_smi
from gpuvigil.node.probes.dcgm_parse import parse_diag, parse_health
from gpuvigil.node.readings import ExpectedGpus, GpuInventory
from gpuvigil.node.sweep import load_checks


def _read(path: Path, check: str) -> tuple[bytes | None, list[Finding]]:
    try:
        return path.read_bytes(), []
    except OSError as e:
        code = "DEPENDENCY_MISSING" if isinstance(e, FileNotFoundError) else "CHECK_ERROR"
        return None, [
            Finding(
                check=check,
                status=Status.FAILED,
                code=code,
                message=f"cannot read {path}: {e.strerror or e}",
                evidence={"path": str(path)},
            )
        ]


def analyze_nvidia_smi(
    path: Path, *, node: NodeConfig, expect: int | None
) -> tuple[list[Finding], GpuInventory | None]:
    data, failed = _read(path, "gpu")
    if data is None:
        return failed, None
    inv = nvidia_smi.parse_xml(data)
    expected = ExpectedGpus(expect, "config" if expect is not None else "none")
    return judge([inv, expected], config=node, now=inv.observed_at, check="gpu"), inv


def analyze_dcgm(path: Path, *, kind: str, level: int | None) -> list[Finding]:
    check = f"dcgm_{kind}"
    data, failed = _read(path, check)
    if data is None:
        return failed
    report = parse_health(data) if kind == "health" else parse_diag(data, level=level)
    return judge([report], config=NodeConfig(), now=utcnow(), check=check)


def analyze_kmsg(path: Path, *, node: NodeConfig, inv: GpuInventory | None) -> list[Finding]:
    """The kernel-log rules as of the capture's end (the kernel-log work's
    `analyze_capture`), with GPUs mapped through the nvidia-smi readings when given."""
    data, failed = _read(path, kernel_log.CHECK)
    if data is None:
        return failed
    return kernel_log.analyze_capture(data, node=node, inventory=inv)


def analyze_sysfs(root: Path, *, node: NodeConfig) -> list[tuple[list[Finding], CheckRun]]:
    """The fabric and PCIe checks with sysfs read below `root` (a folder, or a .tar/.tar.gz
    of one; no tools run)."""
    load_checks()
    if root.is_file():
        with tempfile.TemporaryDirectory(prefix="gpuvigil-sysfs-") as tmp:
            try:
                with tarfile.open(root) as tar:
                    tar.extractall(tmp, filter="data")  # no absolute paths, no escapes
            except (tarfile.TarError, OSError) as e:
                failed = Finding(
                    check="fabric",
                    status=Status.FAILED,
                    code="CHECK_ERROR",
                    message=f"cannot unpack {root}: {e}",
                    evidence={"path": str(root)},
                )
                return [_timed("fabric", lambda: [failed])]
            entries = list(Path(tmp).iterdir())
            top = entries[0] if len(entries) == 1 and entries[0].is_dir() else Path(tmp)
            return analyze_sysfs(top, node=node)
    ctx = CheckContext(config=node, root=root, env={"PATH": ""})
    return [run_check(REGISTRY[name], ctx) for name in ("fabric", "pcie") if name in REGISTRY]


def _timed(name: str, fn: Callable[[], list[Finding]]) -> tuple[list[Finding], CheckRun]:
    started, t0 = datetime.now(UTC), time.monotonic()
    findings = fn()
    run = CheckRun(
        check=name,
        status=Status.worst(f.status for f in findings),
        started_at=started,
        duration_s=time.monotonic() - t0,
    )
    return findings, run


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    def analyze(  # noqa: PLR0917 - typer maps every option to a parameter
        kmsg: Annotated[
            Path | None,
            typer.Option("--kmsg", help="Kernel log (dmesg, journalctl -k, syslog, kmsg)."),
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
                help="A captured root holding sys/class/infiniband etc. (folder or .tar.gz).",
            ),
        ] = None,
        instance_type: Annotated[
            str | None,
            typer.Option("--instance-type", help="e.g. p5.48xlarge: expected GPUs/adapters."),
        ] = None,
        expect_gpus: Annotated[
            int | None, typer.Option("--expect-gpus", min=0, help="GPUs the node must have.")
        ] = None,
        config: Annotated[Path | None, typer.Option("--config", help="YAML config file.")] = None,
        as_json: bool = typer.Option(False, "--json", help="Print the NodeReport as JSON."),
        node_name: str = typer.Option("captured", "--node", help="Node name in the report."),
    ) -> None:
        """Judge captured outputs of a node with the same rules as `gpuvigil check`.

        Exit status: 0 healthy, 1 unhealthy, 2 an input could not be read.
        """
        if not any((kmsg, nvidia_smi_xml, dcgm_health, dcgm_diag, sysfs)):
            typer.echo("gpuvigil analyze: give at least one input (see --help)", err=True)
            raise typer.Exit(2)
        overrides: dict[str, object] = {}
        if instance_type:
            overrides["instance_type"] = instance_type
        if expect_gpus is not None:
            overrides["expect_gpus"] = expect_gpus
        try:
            cfg = config_mod.load(config, overrides={"node": overrides} if overrides else None)
        except config_mod.ConfigError as e:
            typer.echo(f"gpuvigil analyze: config error: {e}", err=True)
            raise typer.Exit(2) from e
        node = cfg.node
        expect = node.expect_gpus
        if expect is None and node.instance_type:
            from gpuvigil.node.probes import instance

            _, entry = instance.lookup(CheckContext(config=node, root=Path("/nonexistent")))
            expect = entry[1].gpus if entry else None
        results: list[tuple[list[Finding], CheckRun]] = []
        inv: GpuInventory | None = None
        if nvidia_smi_xml:
            box: dict[str, GpuInventory | None] = {}

            def smi() -> list[Finding]:
                found, box["inv"] = analyze_nvidia_smi(nvidia_smi_xml, node=node, expect=expect)
                return found

            results.append(_timed("gpu", smi))
            inv = box.get("inv")
        if kmsg:
            results.append(_timed(kernel_log.CHECK, lambda: analyze_kmsg(kmsg, node=node, inv=inv)))
        if dcgm_health:
            results.append(
                _timed("dcgm_health", lambda: analyze_dcgm(dcgm_health, kind="health", level=None))
            )
        if dcgm_diag:
            results.append(
                _timed("dcgm_diag", lambda: analyze_dcgm(dcgm_diag, kind="diag", level=None))
            )
        if sysfs:
            results += analyze_sysfs(sysfs, node=node)
        report = NodeReport(
            node=node_name,
            findings=tuple(f for fs, _ in results for f in fs),
            checks=tuple(run for _, run in results),
        )
        if as_json:
            sys.stdout.write(report_view.as_json(report) + "\n")
        else:
            report_view.render(
                report, console=Console(emoji=False, highlight=False), title="gpuvigil analyze"
            )
        raise typer.Exit(report.exit_code())
