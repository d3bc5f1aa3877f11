"""The basics a command-line user expects: `--version`, `-h`, a bare `gpuvigil` prints help
and exits 0, subcommands load on demand, and help text wraps as prose at any width."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvigil import __version__, cli
from testkit import cli_env

# What `gpuvigil --help` must not import (#13: 0.3-0.4 s of CPU came from gpuvigil.config
# pulling in the agent, the controller and preflight).
HEAVY = ("pydantic", "gpuvigil.config", "gpuvigil.core", "gpuvigil.node", "gpuvigil.platform",
         "gpuvigil.observe", "gpuvigil.sim", "prometheus_client", "gpuvigil.commands")  # fmt: skip


def run(*args: str, columns: int = 80) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": str(columns)})
    return result.exit_code, result.output


def test_version_flags_and_command() -> None:
    for args in (["--version"], ["-V"], ["version"]):
        code, out = run(*args)
        assert code == 0 and out.strip() == f"gpuvigil {__version__}", args


def test_bare_command_prints_help_and_succeeds() -> None:
    code, out = run()
    assert code == 0 and "Usage: gpuvigil" in out and "check" in out and "demo" in out
    assert run("-h") == run("--help") == (0, out)


def test_subcommand_short_help_flag() -> None:
    code, out = run("logscan", "-h")
    assert code == 0 and "Usage: gpuvigil logscan" in out


def test_unknown_command_is_a_usage_error() -> None:
    code, out = run("zzqx")
    assert code == 2 and "No such command 'zzqx'." in out and "Did you mean" not in out


TYPOS = [("chekc", "check"), ("nods", "nodes"), ("rport", "report"), ("simulat", "simulate")]


@pytest.mark.parametrize(("typo", "meant"), TYPOS)
def test_a_typo_gets_a_suggestion(typo: str, meant: str) -> None:
    """The commands load lazily, so the suggestion must come from every command's name,
    not only the loaded ones (it had regressed to none)."""
    code, out = run(typo)
    assert code == 2 and f"No such command '{typo}'. Did you mean '{meant}'" in out


def test_help_imports_no_command_module() -> None:
    """In a fresh interpreter: `gpuvigil --help` imports none of the heavy modules."""
    probe = (
        "import sys\nfrom gpuvigil import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=cli_env({"COLUMNS": "80"}),
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    loaded = out.strip().splitlines()[-1].split()
    heavy = sorted(m for m in loaded if m.startswith(HEAVY))
    assert not heavy, f"gpuvigil --help imported {heavy}"


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_listing_is_the_first_sentence_of_the_commands_help(name: str) -> None:
    """The one line `gpuvigil --help` shows (written down before the module is imported)
    is the first sentence of the command's own help: one text, not two that drift."""
    command = cli.load(name)
    assert cli.first_sentence(command.help or "") == cli.COMMANDS[name][1]


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_help_is_prose_at_any_width(name: str) -> None:
    """A help paragraph is one line to the renderer, so it wraps at the terminal's width:
    at 200 columns no prose line breaks early (a docstring's own line breaks would)."""
    command = cli.load(name)
    for para in (command.help or "").split("\n\n"):
        lines = para.splitlines()
        if len(lines) > 1:  # a literal block (examples) keeps its lines on purpose
            assert all(ln.startswith(cli.LITERAL) for ln in lines)
    code, wide = run(name, "--help", columns=200)
    assert code == 0
    first = cli.first_sentence(command.help or "")
    assert first[:150] in " ".join(wide.split())


def test_tidy_help_keeps_examples_and_joins_prose() -> None:
    text = "One\nsentence.\n\n  gpuvigil a\n  gpuvigil b\n\nExit\nstatus: 0."
    assert cli.tidy_help(text) == "One sentence.\n\n  gpuvigil a\n  gpuvigil b\n\nExit status: 0."
    assert cli.first_sentence("Does this. Then that.") == "Does this."
    assert cli.first_sentence("Run it (e.g. `x`). More") == "Run it (e.g. `x`)."


FAULTY = Path(__file__).resolve().parents[3] / "examples" / "faulty-node"


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--json"],
        ["logscan", str(FAULTY / "dmesg.txt")],
        ["analyze", "--kmsg", str(FAULTY / "dmesg.txt"), "--json"],
    ],
)
def test_node_commands_import_no_other_layer(args: list[str]) -> None:
    """A layer-1 command loads only the `node:` section of the config: it imports neither
    the controller, nor preflight, nor the agent's loop, nor the simulator."""
    probe = (
        "import sys\nfrom gpuvigil import cli\n"
        f"try:\n    cli.main({args!r})\nexcept SystemExit:\n    pass\n"
        "print('MODULES ' + ' '.join(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=cli_env({"COLUMNS": "80"}),
                         capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    loaded = out.rsplit("MODULES ", 1)[-1].split()
    other = ("gpuvigil.platform", "gpuvigil.sim", "gpuvigil.training", "gpuvigil.node.agent",
             "gpuvigil.node.kernel_watch")  # fmt: skip
    assert loaded and not [m for m in loaded if m.startswith(other)], loaded
