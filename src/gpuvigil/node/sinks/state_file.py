"""Writes the latest NodeReport to a file, atomically, for readers on the same machine.

Called by the agent through a SinkWorker. Readers: the training health gate
(`gpuvigil.training`), `gpuvigil slurm-healthcheck` and Slurm prolog scripts. A reader
never sees a torn file, and a planted symlink never redirects the write
(`core.files.write_atomic`: a temporary file in the same folder, fsynced, renamed over the
old one, the folder fsynced). Readers must check `generated_at`:
a file older than a few agent intervals means the agent is not running. A write that fails
(a full disk, a read-only folder) removes the old file: it never goes on saying OK while the
agent knows otherwise, and the agent's /healthz fails at once (`failure_grace_s`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.files import ensure_dir, write_atomic
from gpuvigil.core.findings import NodeReport
from gpuvigil.core.wire import STATE_FILE

DEFAULT_PATH = STATE_FILE
log = logging.getLogger("gpuvigil.agent.state_file")


class StateFileConfig(StrictModel):
    enabled: bool = Field(
        True, description="Write the state file. On by default: local readers need no network."
    )
    path: Path = Field(
        DEFAULT_PATH,
        description="Where the latest report goes. /run is tmpfs: a stale file never "
        "survives a reboot to pass for a fresh one.",
    )
    mode: int = Field(
        0o644,
        ge=0,
        le=0o777,
        description="File mode of the report (its folder gets the same read bits plus "
        "search). World-readable by default: training jobs running as their own user read "
        "it (the health gate). 0o640 keeps it to root and the file's group.",
    )


def read_report(path: Path) -> NodeReport | None:
    """The report in `path`, or None when it is absent or unreadable (callers fail closed)."""
    try:
        return NodeReport.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


class StateFileSink:
    name = "state_file"
    # /healthz fails at the first failed write (`agent.health`): a local file has no server
    # restart to ride out, and every reader is now without a report.
    failure_grace_s = 0.0

    def __init__(self, config: StateFileConfig) -> None:
        self.path, self.mode = config.path, config.mode
        # a world-readable report needs a folder others may enter; otherwise 0750
        ensure_dir(self.path.parent, mode=0o755 if config.mode & 0o004 else 0o750)

    def publish(self, report: NodeReport) -> None:
        try:
            write_atomic(self.path, report.model_dump_json(indent=1).encode(), mode=self.mode)
        except OSError:
            # The old report would go on saying what the agent no longer knows to be true
            # (OK while it sees FAILED): a reader must find nothing instead, and fail closed
            # (the training gate, slurm-healthcheck). Unlinking needs no free block.
            try:
                self.path.unlink(missing_ok=True)
            except OSError as gone:
                log.error("state file %s cannot be written nor removed: %s", self.path, gone)
            raise

    def close(self) -> None:
        pass
