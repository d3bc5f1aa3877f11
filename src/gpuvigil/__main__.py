"""`python -m gpuvigil` runs the command line.

`gpuvigil logscan` in the words `fast_path` understands runs before `gpuvigil.cli` (and
the typer it imports) loads: start-up is most of logscan's cost on an ordinary log.
"""

import sys

if sys.argv[1:2] == ["logscan"]:
    from gpuvigil.commands.logscan import fast_path

    status = fast_path(sys.argv[1:])
    if status is not None:
        raise SystemExit(status)

from gpuvigil.cli import main  # here: only when the fast path did not run it

main()
