"""`gpuvigil demo`: what gpuvigil finds, in under a minute, on any machine.

Interim demo (the fleet simulator replaces it): `gpuvigil check --expect-gpus 0` on this
machine, then `gpuvigil analyze` over the bundled captures of a faulty 8-GPU H100 node
(`examples/faulty-node/`). Both run as subprocesses of this same interpreter, exactly as a
user would type them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

import gpuvigil

# The bundle ships in the repository (and the sdist), next to src/.
BUNDLE = Path(gpuvigil.__file__).resolve().parents[2] / "examples" / "faulty-node"


def _run(args: list[str]) -> int:
    typer.secho(f"\n$ gpuvigil {' '.join(args)}", bold=True)
    return subprocess.run([sys.executable, "-m", "gpuvigil", *args], check=False).returncode


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo() -> None:
        """Check this machine (as a node without GPUs), then analyze a faulty 8-GPU node."""
        here = _run(["check", "--expect-gpus", "0"])
        typer.echo(f"(exit {here}: 0 healthy, 1 unhealthy, 2 a check could not run)")
        if not BUNDLE.is_dir():
            typer.echo(f"example bundle not found at {BUNDLE}", err=True)
            raise typer.Exit(2)
        captured = _run(
            [
                "analyze",
                "--nvidia-smi-xml",
                str(BUNDLE / "nvidia-smi-q-x.xml"),
                "--kmsg",
                str(BUNDLE / "dmesg.txt"),
                "--dcgm-diag",
                str(BUNDLE / "dcgmi-diag-r1.json"),
                "--sysfs",
                str(BUNDLE / "sysfs.tar.gz"),
                "--instance-type",
                "p5.48xlarge",
                "--node",
                "faulty-h100-node",
            ]
        )
        typer.echo(f"(exit {captured}: the bundled node is faulty, so 1 is the right answer)")
        raise typer.Exit(0 if captured == 1 else 1)
