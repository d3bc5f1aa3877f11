"""Every command exits through the one table (core.cli_exit), and the docs state its rows."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuvigil.core.cli_exit import CliExit

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ROOT / "src" / "gpuvigil" / "commands"


def literal_exits(path: Path) -> list[int]:
    """Lines where a command raises typer.Exit or SystemExit with a bare number other than 0."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = ast.unparse(node.func)
        arg = node.args[0]
        numbered = isinstance(arg, ast.Constant) and isinstance(arg.value, int)
        if name in ("typer.Exit", "SystemExit") and numbered and arg.value != 0:
            found.append(node.lineno)
    return found


def test_no_command_exits_with_a_bare_number() -> None:
    offenders = {p.name: lines for p in COMMANDS.glob("*.py") if (lines := literal_exits(p))}
    assert offenders == {}, f"use core.cli_exit.CliExit, not a number: {offenders}"


def test_the_table_is_what_scripts_rely_on() -> None:
    # Slurm's NHC-style wrappers and NPD's plugin protocol read these numbers
    assert (CliExit.OK, CliExit.FAILED, CliExit.CANNOT_TELL) == (0, 1, 2)


def test_architecture_doc_names_every_row() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    for row in CliExit:
        assert f"`{row.value}` {row.name}" in doc, row
