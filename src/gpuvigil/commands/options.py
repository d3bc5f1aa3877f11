"""Command-line options that several node commands share, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ConfigFile = Annotated[Path | None, typer.Option("--config", help="YAML config file.")]
SysfsRoot = Annotated[
    Path | None, typer.Option("--sysfs-root", help="Read /sys and /dev below this folder.")
]
ExpectGpus = Annotated[
    int | None, typer.Option("--expect-gpus", min=0, help="GPUs this node must have.")
]


def slurm_wrapper_help(setting: str, wrapper: str, doc: str, *, more: str = "") -> str:
    """The help's closing paragraph for a command Slurm runs through a wrapper script: the
    slurm.conf line and where the wrapper ships, worded once so each such command installs
    it the same way (/usr/local/sbin, named as in deploy/slurm/)."""
    line = f"{setting}=/usr/local/sbin/{wrapper}{' ' + more if more else ''}"
    return f"\n\nslurm.conf: {line} (the wrapper shipped as deploy/slurm/{wrapper}; {doc})"
