"""The one table of the `gpuvigil` command's own exit statuses (docs/architecture.md, "One
exit rule"). A training worker's codes are another table (`core.exit_codes`): they name who
a job's failure is charged to, these say what a command found.

A script that runs `gpuvigil check`, `analyze`, `preflight` or `slurm-healthcheck` acts on
1 and must not act on 2: 2 says nothing about the node, only that the command could not
find out (typer's own usage errors are 2 too, for the same reason).
"""

from __future__ import annotations

from enum import IntEnum


class CliExit(IntEnum):
    OK = 0  # healthy; or the command did what it was asked
    FAILED = 1  # a definite answer of "no": a failure found, a refusal, no such node, SLO missed
    CANNOT_TELL = 2  # could not find out: bad input or config, a check that could not run
    STALLED = 3  # `gpuvigil agent`: its own watchdog found the check loop stuck
