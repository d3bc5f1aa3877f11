"""Writes the latest NodeReport to a file, atomically, for readers on the same machine.

Called by the agent through a SinkWorker. Readers: the training health gate
(`gpuvigil.training`), `gpuvigil slurm-healthcheck` and Slurm prolog scripts. A reader
never sees a torn file: the report is written to a temporary file in the same folder,
fsynced, then renamed over the old one (rename is atomic within a file system), and the
folder is fsynced so the rename survives a crash. Readers must check `generated_at`:
a file older than a few agent intervals means the agent is not running.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import NodeReport
from gpuvigil.core.wire import STATE_FILE

DEFAULT_PATH = STATE_FILE


class StateFileConfig(StrictModel):
    enabled: bool = Field(
        True, description="Write the state file. On by default: local readers need no network."
    )
    path: Path = Field(
        DEFAULT_PATH,
        description="Where the latest report goes. /run is tmpfs: a stale file never "
        "survives a reboot to pass for a fresh one.",
    )


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_report(path: Path) -> NodeReport | None:
    """The report in `path`, or None when it is absent or unreadable (callers fail closed)."""
    try:
        return NodeReport.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


class StateFileSink:
    name = "state_file"

    def __init__(self, config: StateFileConfig) -> None:
        self.path = config.path

    def publish(self, report: NodeReport) -> None:
        write_atomic(self.path, report.model_dump_json(indent=1).encode())

    def close(self) -> None:
        pass
