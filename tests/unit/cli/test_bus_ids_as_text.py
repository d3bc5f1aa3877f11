"""PCI bus ids print as text in the `check` / `analyze` tables: rich reads `:ab:` as an
emoji code unless told not to ("0000:ab:00" once printed as "0000🆎00")."""

from __future__ import annotations

import io

from rich.console import Console

from gpuvigil.commands import report_view
from gpuvigil.core.findings import Finding, NodeReport, Status


def test_a_bus_id_in_a_message_stays_text() -> None:
    f = Finding(
        check="kernel_log",
        status=Status.WARNING,
        code="XID_63",
        component="gpu:5",
        message="Xid 63 on GPU 5 (0000:ab:00): GPU memory remapping event",
    )
    out = io.StringIO()
    console = Console(file=out, width=120, emoji=False, highlight=False, color_system=None)
    report_view.render(NodeReport(node="n", findings=(f,)), console=console, title="t")
    assert "0000:ab:00" in out.getvalue()
    assert "\N{NEGATIVE SQUARED AB}" not in out.getvalue()
