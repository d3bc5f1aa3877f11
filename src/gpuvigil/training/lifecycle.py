"""The job's own record of its life: exit records, and job.start / job.restart / job.end.

Whoever sees an attempt end writes an **exit record** beside the checkpoints
(`<checkpoint dir>/.gpuvigil/exits/`, shared by every node): a rank on its way out (drain,
failed saves, an exception, its hang watchdog) and the per-node monitor (`monitor`: a frozen
or dead rank). The next attempt's rank 0 reads them all, names the cause, writes
`job.restart` with it and the work lost, and removes them (`Lifecycle.started`).

Events (core.events) for `gpuvigil report`'s job success, goodput and attribution:
- `job.start`: rank 0 of a job's first attempt (nothing to resume, no earlier attempt);
- `job.restart`: rank 0 of every attempt that follows one (a torchrun restart, or a job
  resubmitted after a drain), with `cause` (`core.exit_codes.Charged`, the one cause
  vocabulary), `kind` (what was seen, under that cause: `KINDS`), `reason`, `exit_code`,
  `node`, `rank` of the culprit, `resumed_step`, `lost_steps` and `lost_s`;
- `job.end`: rank 0 when the loop finished and its last save committed (succeeded), or the
  launcher when torchrun gave up (failed, with the culprit's exit code; `interrupted` when
  that code is one a retry spares, a drain: the job goes on elsewhere).
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
from gpuvigil.core.exit_codes import Charged
from gpuvigil.training.storage import Storage

log = logging.getLogger("gpuvigil.training.lifecycle")

EXITS = ".gpuvigil/exits"

# What was seen when an attempt ended, most telling first (the first record of the lowest
# kind names the culprit), each under the one cause it is charged to.
KINDS: tuple[tuple[str, Charged], ...] = (
    ("frozen", Charged.HANG),  # the monitor found a rank stopped (SIGSTOP), making no progress
    ("behind", Charged.HANG),  # the rank that never entered the collective its peers wait in
    ("dead", Charged.UNKNOWN),  # a rank died (a signal, an exit the rank did not report)
    ("hang", Charged.HANG),  # a rank's own watchdog fired, not waiting in a collective
    ("node_unhealthy", Charged.NODE),  # the health gate refused the node
    ("checkpoint_failed", Charged.STORAGE),  # saves failed too often in a row
    ("no_verified_checkpoint", Charged.STORAGE),  # checkpoints exist, none verifies
    ("user_code", Charged.USER),  # an exception in the training script
    ("drained", Charged.DRAIN),  # SIGTERM: the step finished, a checkpoint saved, exit 89
    ("victim", Charged.UNKNOWN),  # a rank that waited on a collective for a culprit elsewhere,
    # or one that SIGTERM killed outright: torchrun (and the kubelet, through it) stops the
    # survivors of a failed group with SIGTERM, and a rank that meant to stop on it drains
)
_ORDER = {k: i for i, (k, _) in enumerate(KINDS)}
CAUSE_OF_KIND = dict(KINDS)


@dataclass(frozen=True)
class ExitRecord:
    ts: float
    kind: str  # one of KINDS
    rank: int
    node: str
    exit_code: int | None
    step: int  # last completed step of that rank
    detail: str
    by: str = "rank"  # rank | monitor

    @property
    def cause(self) -> Charged:
        return cause_of(self.kind)


def cause_of(kind: str) -> Charged:
    return CAUSE_OF_KIND.get(kind, Charged.UNKNOWN)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


def write_exit(storage: Storage | None, rec: ExitRecord) -> None:
    """Best effort: a missing record only makes the next job.restart less specific."""
    if storage is None:
        return
    name = f"{EXITS}/{time.time_ns()}-{_safe(rec.node)}-rank{rec.rank}-{rec.by}.json"
    try:
        storage.write_atomic(name, json.dumps({**asdict(rec), "cause": rec.cause.value}).encode())
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
                    str(d["kind"]),
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
    """The record that names why the attempt ended: the most telling kind (`KINDS`),
    the earliest of equals. A rank killed by a signal after a peer began to drain is that
    drain's victim, not its cause: the platform took the peer's node away, the gang was
    stopped, and a rank waiting in a collective for the drained one could not save in its
    grace period and was killed (the drained node is the one to name, not its peer)."""
    drains = [r.ts for r in records if r.kind == "drained"]
    drained_at = min(drains) if drains else None

    def order(r: ExitRecord) -> tuple[int, float]:
        kind = r.kind
        if kind == "dead" and drained_at is not None and r.ts >= drained_at:
            kind = "victim"
        return (_ORDER.get(kind, len(KINDS)), r.ts)

    return min(records, key=order) if records else None


def kind_of_exit(code: int) -> str:
    """What a rank's exit code says happened (for records the monitor writes). A death
    by SIGTERM is a victim's: the monitor records every rank torchrun reports, in rank
    order, so a survivor that torchrun's SIGTERM caught unwinding (its drain handler
    already restored) must not outrank the rank whose death stopped the group."""
    if code in (-signal.SIGTERM, exit_codes.SIGNAL_BASE + signal.SIGTERM):
        return "victim"
    return {
        exit_codes.HANG: "hang",
        exit_codes.DRAINED: "drained",
        exit_codes.CHECKPOINT_FAILED: "checkpoint_failed",
        exit_codes.NO_VERIFIED_CHECKPOINT: "no_verified_checkpoint",
        exit_codes.NODE_UNHEALTHY: "node_unhealthy",
        exit_codes.NODE_STATE_UNKNOWN: "node_unhealthy",
        # A survivor of an in-process restart whose lost peer was never replaced.
        exit_codes.RANK_NOT_REPLACED: "victim",
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
        data.update(
            cause=Charged.UNKNOWN.value,
            reason="no exit record: the previous attempt left no trace",
        )
        return data
    furthest = max(r.step for r in records)
    data.update(
        cause=c.cause.value,
        kind=c.kind,
        reason=f"{c.kind}: rank {c.rank} on {c.node}: {c.detail}",
        exit_code=c.exit_code,
        node=c.node,
        rank=c.rank,
        lost_steps=max(0, furthest - resumed_step),
    )
    return data
