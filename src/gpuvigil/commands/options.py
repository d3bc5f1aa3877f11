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
