"""`gpuvigil slurm-taskprolog`: slurm.conf's TaskProlog on nodes without device cgroups."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from gpuvigil.commands import options
from gpuvigil.node.slurm_taskprolog import prolog_lines

HELP = (
    "Print the TaskProlog lines that make a Slurm task's CUDA_VISIBLE_DEVICES name GPU "
    "device numbers (/dev/nvidiaN) instead of gres.conf positions, so a job on a node "
    "degraded to 7 GPUs never sees the GPU taken out; a task whose GPUs cannot be mapped "
    "gets none. Only for nodes without ConstrainDevices=yes. Always exits 0 (a failing "
    "TaskProlog would fail the task; the fail-closed answer is no GPU)."
) + options.slurm_wrapper_help("TaskProlog", "gpuvigil-taskprolog", "docs/slurm.md")


def register(app: typer.Typer) -> None:
    @app.command("slurm-taskprolog", help=HELP)
    def slurm_taskprolog(
        gres_conf: Annotated[
            Path | None,
            typer.Option(
                "--gres-conf",
                help="gres.conf to read (default: beside $SLURM_CONF, else /etc/slurm/gres.conf).",
            ),
        ] = None,
    ) -> None:
        conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
        path = gres_conf or conf.parent / "gres.conf"
        try:
            text: str | None = path.read_text()
        except OSError:
            text = None
        for line in prolog_lines(os.environ, text):
            print(line)
