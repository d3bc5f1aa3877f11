"""How `gpuvigil check` and `gpuvigil analyze` show a NodeReport: a rich table for people,
or the NodeReport as JSON (the stable format documented in docs/checks.md)."""

from __future__ import annotations

import json
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuvigil.commands.terminal import printable
from gpuvigil.core.findings import NodeReport, Status
from gpuvigil.node.readings import GpuInventory

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


def render(report: NodeReport, *, console: Console, title: str) -> None:
    checks = Table(title=f"{title}: {report.node}", title_justify="left")
    for col in ("check", "status", "took"):
        checks.add_column(col)
    for run in report.checks:
        status = "disabled" if run.disabled else run.status.value
        checks.add_row(
            run.check, f"[{_STYLE[status]}]{status}[/]", f"{run.duration_s * 1000:.0f} ms"
        )
    if report.checks:
        console.print(checks)
    # Problems, and checks that are switched off (shown so that "off" is never "passed").
    shown = [f for f in report.findings if f.status is not Status.OK or f.code == "CHECK_DISABLED"]
    if shown:
        table = Table(title="Findings", title_justify="left", show_lines=True)
        table.add_column("status", no_wrap=True)
        table.add_column("component", no_wrap=True)
        table.add_column("finding", overflow="fold", ratio=1)
        table.add_column("action / check", no_wrap=True)
        for f in sorted(shown, key=lambda f: (-f.status.rank, f.check, f.component, f.code)):
            style = "disabled" if f.code == "CHECK_DISABLED" else f.status.value
            table.add_row(
                f"[{_STYLE[style]}]{f.status.value}[/]",
                escape(printable(f.component)),
                f"[bold]{escape(printable(f.code))}[/]\n{escape(printable(f.message))}",
                f"{f.action.value}\n[dim]{f.check}[/]",
            )
        console.print(table)
    if any(f.code == "DRIVER_UNAVAILABLE" for f in report.findings):
        console.print(
            "[bold red]No usable NVIDIA driver on a node configured to have GPUs.[/] "
            "Install/load the driver, or run with --expect-gpus 0 on a node without GPUs."
        )
    console.print(verdict(report))
    for cond in report.conditions:
        if cond.status:
            console.print(f"  condition {cond.type}=True ({cond.reason})")
