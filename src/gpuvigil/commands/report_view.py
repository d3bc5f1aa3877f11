"""How `gpuvigil check` and `gpuvigil analyze` show a NodeReport: a rich table for people,
or the NodeReport as JSON (the stable format documented in docs/checks.md)."""

from __future__ import annotations

import json
from collections import Counter

from rich.console import Console
from rich.markup import escape

from gpuvigil.core.findings import NodeReport, Status
from gpuvigil.node.checks.gpu.readings import GpuInventory
from gpuvigil.observe import terminal
from gpuvigil.observe.terminal import Column, plain, printable

_STYLE = {"OK": "green", "WARNING": "yellow", "FAILED": "bold red", "disabled": "dim"}


def as_json(report: NodeReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2)


def verdict(report: NodeReport) -> str:
    code = report.exit_code()
    if code == 2:
        return "COULD NOT TELL: a check could not run (exit 2)"
    if code == 1:
        failed = [f for f in report.problems if f.status is Status.FAILED]
        return f"UNHEALTHY: {len(failed)} failed finding(s), action {report.action.value} (exit 1)"
    warnings = [f for f in report.problems if f.status is Status.WARNING]
    return f"HEALTHY{f' with {len(warnings)} warning(s)' if warnings else ''} (exit 0)"


def inventory_line(inv: GpuInventory) -> str:
    """One line saying what was looked at: `8 x NVIDIA H100 80GB HBM3 (Hopper), driver
    550.90.07, read via nvml`."""
    names = Counter(g.name or "unknown GPU" for g in inv.gpus if not g.lost)
    arch = {g.name: g.architecture for g in inv.gpus if g.architecture}
    parts = [
        f"{n} x {name}" + (f" ({arch[name]})" if arch.get(name) else "")
        for name, n in names.most_common()
    ]
    lost = sum(1 for g in inv.gpus if g.lost)
    if lost:
        parts.append(f"{lost} not answering")
    what = ", ".join(parts) or "no GPUs"
    driver = f", driver {inv.driver_version}" if inv.driver_version else ""
    return f"GPUs: {what}{driver}, read via {inv.source}"


def no_gpu_flags(report: NodeReport) -> list[str]:
    """The flags that make this report's DRIVER_UNAVAILABLE findings go away on a machine
    without GPUs: `--expect-gpus 0` for the node checks, `--device cpu` for preflight's
    active checks (which need CUDA however many GPUs are expected)."""
    missing = [f for f in report.findings if f.code == "DRIVER_UNAVAILABLE"]
    flags = []
    if any(not f.check.startswith("active.") for f in missing):
        flags.append("--expect-gpus 0")
    if any(f.check.startswith("active.") for f in missing):
        flags.append("--device cpu")
    return flags


def render(report: NodeReport, *, console: Console, title: str) -> None:
    """The checks that ran, then every problem (and every check switched off, so that "off"
    is never read as "passed"), laid out to the console's width without cutting a code,
    a component or a word of a message."""
    w = console.width
    checks = [
        [run.check, f"[{_STYLE[s]}]{s}[/]", f"{run.duration_s * 1000:,.0f} ms"]
        for run in report.checks
        for s in ["disabled" if run.disabled else run.status.value]
    ]
    if checks:
        cols = (Column("check", key=True), Column("status"),
                Column("took", justify="right", wrap=False))  # fmt: skip
        console.print(terminal.render(cols, checks, width=w, title=f"{title}: {report.node}"))
    shown = [f for f in report.findings if f.status is not Status.OK or f.code == "CHECK_DISABLED"]
    if shown:
        cols = (Column("status", key=True), Column("component", key=True),
                Column("finding"), Column("action / check"))  # fmt: skip
        rows = []
        for f in sorted(shown, key=lambda f: (-f.status.rank, f.check, f.component, f.code)):
            style = "disabled" if f.code == "CHECK_DISABLED" else f.status.value
            rows.append([f"[{_STYLE[style]}]{f.status.value}[/]", plain(printable(f.component)),
                         f"[bold]{escape(printable(f.code))}[/]\n{escape(printable(f.message))}",
                         f"{f.action.value}\n[dim]{escape(f.check)}[/]"])  # fmt: skip
        console.print(terminal.render(cols, rows, width=w, title="Findings"))
    flags = no_gpu_flags(report)
    if flags:
        console.print(
            "[bold red]No usable NVIDIA driver or CUDA on a node configured to have GPUs.[/] "
            f"Install/load the driver, or on a machine without GPUs run with {' '.join(flags)}."
        )
    console.print(verdict(report))
    for cond in report.conditions:
        if cond.status:
            console.print(f"  condition {cond.type}=True ({cond.reason})")
