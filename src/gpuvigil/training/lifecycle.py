"""The job's own record of its life: exit records, and job.start / job.restart / job.end.

Whoever sees an attempt end writes an **exit record** beside the checkpoints
(`<checkpoint dir>/.gpuvigil/exits/`, shared by every node): a rank on its way out (drain,
failed saves, an exception, its hang watchdog) and the per-node monitor (`monitor`: a frozen
or dead rank). The next attempt's rank 0 reads them all, names the cause, writes
`job.restart` with it and the work lost, and removes them (`Lifecycle.started`).

Events (core.events) for `gpuvigil report`'s job success, goodput and attribution:
- `job.start`: rank 0 of a job's first attempt (nothing to resume, no earlier attempt);
- `job.restart`: rank 0 of every attempt that follows one (a torchrun restart, or a job
  resubmitted after a drain), with `cause`, `reason`, `exit_code`, `node`, `rank` of the
  culprit, `resumed_step`, `lost_steps` and `lost_s`;
- `job.end`: rank 0 when the loop finished and its last save committed (succeeded), or the
  launcher when torchrun gave up (failed, with the culprit's exit code).
"""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from dataclasses import asdict, dataclass
from typing import Any

from gpuvigil.core import exit_codes
from gpuvigil.training.storage import Storage

log = logging.getLogger("gpuvigil.training.lifecycle")

EXITS = ".gpuvigil/exits"

# Why an attempt ended, most telling first: the first record of the lowest rank names it.
CAUSES = (
    "frozen",  # the monitor found a rank stopped (SIGSTOP), making no progress
    "dead",  # a rank died (a signal, an exit the rank itself did not report)
    "hang",  # a rank's own watchdog fired and it was not waiting in a collective
    "node_unhealthy",  # the health gate refused the node
    "checkpoint_failed",  # saves failed too often in a row
    "user_code",  # an exception in the training script
    "drain",  # SIGTERM: the step finished, a checkpoint saved, exit 89
    "victim",  # a rank that waited on a collective for a culprit elsewhere, or one that
    # SIGTERM killed outright: torchrun (and the kubelet, through it) stops the survivors of a
    # failed group with SIGTERM, and a rank that meant to stop on it drains and exits 89
)


@dataclass(frozen=True)
class ExitRecord:
    ts: float
    cause: str
    rank: int
    node: str
    exit_code: int | None
    step: int  # last completed step of that rank
    detail: str
    by: str = "rank"  # rank | monitor


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


def write_exit(storage: Storage | None, rec: ExitRecord) -> None:
    """Best effort: a missing record only makes the next job.restart less specific."""
    if storage is None:
        return
    name = f"{EXITS}/{time.time_ns()}-{_safe(rec.node)}-rank{rec.rank}-{rec.by}.json"
    try:
        storage.write_atomic(name, json.dumps(asdict(rec)).encode())
    except Exception as e:  # noqa: BLE001 (the exit it describes must still happen)
        log.warning("could not write exit record %s: %s", name, e)


def read_exits(storage: Storage) -> tuple[list[ExitRecord], list[str]]:
    """Every exit record left by earlier attempts (garbage skipped) and their names."""
    out, names = [], []
    for name in storage.list_dir(EXITS):
        rel = f"{EXITS}/{name}"
        names.append(rel)
        try:
            d = json.loads(storage.read_bytes(rel))
            out.append(
                ExitRecord(
                    float(d["ts"]),
                    str(d["cause"]),
                    int(d["rank"]),
                    str(d["node"]),
                    d["exit_code"] if type(d.get("exit_code")) is int else None,
                    int(d.get("step", 0)),
                    str(d.get("detail", "")),
                    str(d.get("by", "rank")),
                )
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("skipping unreadable exit record %s: %s", name, e)
    return out, names


def culprit(records: list[ExitRecord]) -> ExitRecord | None:
    """The record that names why the attempt ended: the most telling cause (`CAUSES`),
    the earliest of equals. A rank killed by a signal after a peer began to drain is that
    drain's victim, not its cause: the platform took the peer's node away, the gang was
    stopped, and a rank waiting in a collective for the drained one could not save in its
    grace period and was killed (the drained node is the one to name, not its peer)."""
    drains = [r.ts for r in records if r.cause == "drain"]
    drained_at = min(drains) if drains else None

    def order(r: ExitRecord) -> tuple[int, float]:
        cause = r.cause
        if cause == "dead" and drained_at is not None and r.ts >= drained_at:
            cause = "victim"
        return (CAUSES.index(cause) if cause in CAUSES else len(CAUSES), r.ts)

    return min(records, key=order) if records else None


def cause_of_exit(code: int) -> str:
    """The cause a rank's exit code stands for (for records the monitor writes). A death
    by SIGTERM is a victim's: the monitor records every rank torchrun reports, in rank
    order, so a survivor that torchrun's SIGTERM caught unwinding (its drain handler
    already restored) must not outrank the rank whose death stopped the group."""
    if code in (-signal.SIGTERM, exit_codes.SIGNAL_BASE + signal.SIGTERM):
        return "victim"
    return {
        exit_codes.HANG: "hang",
        exit_codes.DRAINED: "drain",
        exit_codes.CHECKPOINT_FAILED: "checkpoint_failed",
        exit_codes.NO_VERIFIED_CHECKPOINT: "checkpoint_failed",
        exit_codes.NODE_UNHEALTHY: "node_unhealthy",
        exit_codes.NODE_STATE_UNKNOWN: "node_unhealthy",
    }.get(code, "dead" if code < 0 or code > exit_codes.SIGNAL_BASE else "user_code")


def restart_data(
    records: list[ExitRecord],
    *,
    attempt: int,
    resumed_step: int,
    saved_ts: float | None,
    now: float,
) -> dict[str, Any]:
    """The data of a job.restart event from the records of the attempt that ended."""
    c = culprit(records)
    data: dict[str, Any] = {
        "attempt": attempt,
        "resumed_step": resumed_step,
        "lost_s": round(max(0.0, now - saved_ts), 3) if saved_ts is not None else None,
    }
    if c is None:
        data.update(cause="unknown", reason="no exit record: the previous attempt left no trace")
        return data
    furthest = max(r.step for r in records)
    data.update(
        cause=c.cause,
        reason=f"{c.cause}: rank {c.rank} on {c.node}: {c.detail}",
        exit_code=c.exit_code,
        node=c.node,
        rank=c.rank,
        lost_steps=max(0, furthest - resumed_step),
    )
    return data
