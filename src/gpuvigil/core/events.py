"""The event log: one JSON object per line, one schema, written by every layer.

Events are the source of truth for SLOs and failure attribution (layer 4). The envelope
is fixed here; each kind's `data` fields are documented in `docs/events.md`.
Writers append whole lines with one write() so a crash leaves at most one torn last line,
which readers skip with a warning.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuvigil.core.files import open_append

SCHEMA_VERSION = 1


class Kind(StrEnum):
    """Event kinds; the `data` fields of each are documented in docs/events.md."""

    FINDING_SET = "finding.set"  # data: code, component, status, action, fatal, check, message
    FINDING_CLEARED = "finding.cleared"  # same data as finding.set
    NODE_STATE = "node.state"  # controller transition; data: from, to, reason, codes, components
    MAINTENANCE = "node.maintenance"  # planned maintenance; data: phase (start|end), reason
    REMEDIATION = "remediation"  # data: action, result (started|succeeded|failed|skipped), reason
    BREAKER = "breaker"  # data: state (open|closed), reason
    JOB_START = "job.start"  # data: nodes, gpus
    JOB_RESTART = "job.restart"  # data: reason, lost_s, node
    # rank 0, after the first step of each attempt: when its phases ended (lab restart phases)
    # data: attempt, step, first_step_s, init_ts, group_ts, restored_ts
    STARTUP = "startup"
    JOB_END = "job.end"  # data: result, exit_code, productive_gpu_s, allocated_gpu_s
    CHECKPOINT = "checkpoint"  # data: step, duration_s, stall_s, result
    STRAGGLER = "straggler"  # data: rank, ratio, windows
    HANG = "hang"  # data: rank, step, where
    FAULT = "fault"  # simulator ground truth, a fault injected; data: fault, component


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = SCHEMA_VERSION
    ts: float  # seconds since the epoch, UTC (simulated time in the simulator)
    kind: str
    source: str  # agent | controller | training | sim | ...
    node: str | None = None
    job: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)

    def to_line(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True), separators=(",", ":"), sort_keys=True)


class EventWriter:
    """Appends events to a JSONL file; thread-safe, one write() per line, fsync optional."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        self.path = path
        self._fsync = fsync
        self._lock = threading.Lock()
        # 0640 in a 0750 folder whatever the umask, never through a symlink (core.files)
        self._fd = open_append(path)

    def write(self, event: Event) -> None:
        data = (event.to_line() + "\n").encode()
        with self._lock:
            os.write(self._fd, data)
            if self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_CAUSE_CODES = 32  # findings a node.state names: enough for 8 GPUs' worth, still bounded


def cause_fields(found: Iterable[Any]) -> dict[str, list[str]]:
    """A `node.state`'s structured why, from the findings behind the move (anything with
    `code` and `component`, worst first): `codes` and the index-aligned `components`,
    duplicates dropped, at most MAX_CAUSE_CODES. Written by the controller and by the
    simulator alike; layer 4 reads these, never `reason`. Empty lists: no finding
    explains the move."""
    pairs = list(dict.fromkeys((str(f.code), str(f.component)) for f in found))
    pairs = pairs[:MAX_CAUSE_CODES]
    return {"codes": [c for c, _ in pairs], "components": [c for _, c in pairs]}
