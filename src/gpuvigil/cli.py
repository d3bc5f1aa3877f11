"""The `gpuvigil` command: one entry point, one module per subcommand in `commands/`.

A subcommand's module is imported only when that subcommand runs (or shows its own
`--help`): `gpuvigil --help`, `--version` and a typo cost only typer, and `gpuvigil logscan`
never imports the controller. `COMMANDS` lists each subcommand with the one line the
command list shows; `tests/unit/cli/test_cli.py` holds that line to the first sentence of
the command's own help. Nothing here registers metrics or reads the environment at import.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from gpuvigil import __version__

# name -> (module under gpuvigil.commands, the command list's one line). In the order
# `gpuvigil --help` lists them: layer 1, layer 2, layer 4, the simulator.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("check", "Run every node health check here once (GPUs, DCGM, kernel log, "
              "fabric, PCIe)."),
    "analyze": ("analyze", "Judge a node's captured outputs with the rules of "
                "`gpuvigil check`."),
    "logscan": ("logscan", "Every NVIDIA Xid (GPU) and SXid (NVSwitch) event in a kernel "
                "log, in order."),
    "agent": ("agent", "Run the node agent: checks on schedules, the kernel log as a stream, "
              "and the verdict published to the chosen sinks until stopped (SIGTERM/SIGINT)."),
    "npd-plugin": ("npd", "Run the named checks once as a node-problem-detector custom "
                   "plugin: exit 0 OK, 1 a problem, 2 unknown (a check could not run: "
                   "timeout, missing tool, stale result)."),
    "slurm-healthcheck": ("slurm_healthcheck", "Judge this node once and drain it in Slurm "
                          "on a problem, the way NHC does; meant for slurm.conf's "
                          "HealthCheckProgram (runs as root on every node)."),
    "slurm-taskprolog": ("slurm_taskprolog", "Print the TaskProlog lines that make a Slurm "
                         "task's CUDA_VISIBLE_DEVICES name GPU device numbers (/dev/nvidiaN) "
                         "instead of gres.conf positions, so a job on a node degraded to 7 "
                         "GPUs never sees the GPU taken out; a task whose GPUs cannot be "
                         "mapped gets none."),
    "preflight": ("preflight", "Validate this node before it takes work: fast node checks, "
                  "then active tests (matmul correctness in bf16/fp16/tf32/fp32, sustained "
                  "TFLOP/s vs the GPU's peak, device-memory patterns, host/peer bandwidth, "
                  "all-reduce bus bandwidth), all within one time budget."),
    "controller": ("controller", "Watch every node's health and remediate progressively "
                   "and safely."),
    "nodes": ("nodes", "List each node's gpuvigil state (HEALTHY, SUSPECT, DRAINING, "
              "REMEDIATING, VALIDATING, QUARANTINED), since when, why, who blocks it, what "
              "the controller does next and what holds it (budget, breaker, capacity, "
              "cooldown); one NODE adds its history."),
    "explain": ("explain", "Tell one node's story in time order: what the agent found, what "
                "the controller decided (or, in dry run, would have) and why, from the event "
                "logs and the node's API object."),
    "release": ("release", "Release a QUARANTINED node: gpuvigil ends this episode's ladder "
                "and moves it to VALIDATING; it returns to service when preflight passes "
                "(and a fresh health summary is clean)."),
    "report": ("report", "SLOs (availability, job success, goodput, MTTD, MTTR, "
               "false-positive drains, error-budget burn) and the likely cause of every "
               "failed or restarted job, from gpuvigil event logs."),
    "simulate": ("simulate", "Simulate a GPU fleet with and without gpuvigil's layers and "
                 "print what each buys."),
    "replay": ("replay", "Run recorded history through a remediation policy in dry run: "
               "every state change, remediation step and hold the controller would have "
               "made, and why."),
    "demo": ("demo", "Simulate a GPU fleet with and without gpuvigil, print what each layer "
             "buys, and write the HTML report of the run with every layer on."),
    "lab": ("lab", "Inject one fault into the whole platform running on this machine, on "
            "real parts, and show what every part did about it, second by second."),
}  # fmt: skip

HELP = (
    "Keeps GPU fleets fit for gang training: fail-closed node checks (check, analyze, "
    "logscan, agent, preflight), safe remediation (controller, nodes, release), and the "
    "numbers that prove it (report, simulate, demo, lab).\n\n"
    "Try it without a GPU: gpuvigil demo"
)
# Lines that start so are commands to paste (examples): kept one per line.
LITERAL = (" ", "gpuvigil ", "sudo ", "journalctl ")
ABBREVIATIONS = ("e.g.", "i.e.", "vs.", "etc.")
VERSION_HELP = "Print gpuvigil's version and exit."
CONTEXT = {"help_option_names": ["-h", "--help"]}


def tidy_help(text: str) -> str:
    """One line per paragraph, so the help renderer wraps prose to the terminal's width
    instead of keeping the line breaks of a docstring (which split sentences at 80
    columns). Paragraphs whose lines are commands or indented (examples) keep their lines."""
    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.splitlines()
        literal = len(lines) > 1 and all(ln.startswith(LITERAL) for ln in lines)
        out.append(para if literal else " ".join(para.split()))
    return "\n\n".join(out)


def first_sentence(text: str) -> str:
    """The first sentence of a help text's first paragraph (what the command list shows)."""
    para = " ".join(tidy_help(text).split("\n\n")[0].split())
    for m in re.finditer(r"(?<=[.!?])\s+(?=\S)", para):
        if not para[: m.start()].endswith(ABBREVIATIONS):
            return para[: m.start()]
    return para


class _Listed(TyperCommand):
    """A subcommand as `gpuvigil --help` lists it, before its module is imported."""

    def __init__(self, name: str, summary: str) -> None:
        super().__init__(name, short_help=summary, help=summary)


class LazyGroup(TyperGroup):
    """Imports a subcommand's module when the subcommand is resolved to run."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*COMMANDS, *(n for n in self.commands if n not in COMMANDS)]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> TyperCommand | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        if cmd_name in COMMANDS:
            return _Listed(cmd_name, COMMANDS[cmd_name][1])
        return None

    def resolve_command(
        self, ctx: typer.Context, args: list[str]
    ) -> tuple[str | None, TyperCommand | None, list[str]]:
        try:
            name, cmd, rest = super().resolve_command(ctx, args)
        except typer.TyperException as e:  # typer's (vendored) click UsageError
            # typer suggests from `self.commands`, which holds only the commands already
            # imported (none: they load lazily): suggest from every command's name.
            typo = args[0] if args else ""
            close = difflib.get_close_matches(typo, self.list_commands(ctx))
            message = getattr(e, "message", None)
            if typo.startswith("-") or not close or not isinstance(message, str):
                raise
            if "Did you mean" in message:
                raise
            e.message = f"No such command {typo!r}. Did you mean {', '.join(map(repr, close))}?"
            raise
        if isinstance(cmd, _Listed) and name is not None:
            cmd = load(name)
        return name, cmd, rest


def load(name: str) -> TyperCommand:
    """Import one subcommand's module and build its click command (tidied help)."""
    module = importlib.import_module(f"gpuvigil.commands.{COMMANDS[name][0]}")
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                      context_settings=CONTEXT)  # fmt: skip
    module.register(sub)
    for info in sub.registered_commands:
        doc = info.help or inspect.getdoc(info.callback) or ""
        info.help = tidy_help(doc)
        info.short_help = COMMANDS[name][1]
        info.context_settings = {**CONTEXT, **(info.context_settings or {})}
    cmd = typer.main.get_command(sub)
    cmd.name = name
    return cmd


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuvigil {__version__}")
        raise typer.Exit(0)


app = typer.Typer(
    name="gpuvigil",
    cls=LazyGroup,
    help=HELP,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
    invoke_without_command=True,
    rich_markup_mode=None,
)


@app.callback()
def main_callback(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help=VERSION_HELP
    ),
) -> None:
    if ctx.invoked_subcommand is None:  # bare `gpuvigil`: the help, and success
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


@app.command("version")
def version_command() -> None:
    """Print gpuvigil's version (the same as `gpuvigil --version`)."""
    _version(True)


def main(argv: list[str] | None = None) -> Any:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["logscan"]:  # typer-free when it can be (`logscan.fast_path`)
        from gpuvigil.commands.logscan import fast_path

        status = fast_path(words)
        if status is not None:
            raise SystemExit(status)
    return app(args=argv)
