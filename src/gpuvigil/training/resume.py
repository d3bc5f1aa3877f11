"""Loading a checkpoint: verified in parallel, before anything is read, and never unpickled.

Called by `run.Run` when it starts. For the newest checkpoint folder first:
1. rank 0 reads and checks the manifest (only the manifest) and sends its file table to all;
2. every rank checks the sizes and SHA-256 sums of its own share of the files
   (`manifest.assign`: its own `__R_0.distcp` and `rank-R.json`; job-wide files and those of
   ranks gone after a resize to the least-loaded rank), so the time to verify grows with the
   largest rank's share, not with the whole checkpoint;
3. the verdicts are gathered: if any file is damaged, every rank skips the folder for the
   previous one, logged with the reason and counted.
A damaged folder is never deleted: rank 0 renames it `damaged-step-N` (`keep_damaged`), out
of reach of pruning and of a new save of the same step. When checkpoints exist but none
verifies, the job does not start again at step 0: every rank exits with
`exit_codes.NO_VERIFIED_CHECKPOINT` (`NoVerifiedCheckpoint`), unless
`checkpoint.allow_fresh_start` says so.
Only then do the ranks read: tensors through DCP (`dcp_storage`: bytes into tensors of the
dtype and shape the JSON metadata names) and state from JSON (`state_codec`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from gpuvigil.core import exit_codes
from gpuvigil.training import dcp_storage, manifest, state_codec, tensor_tree
from gpuvigil.training.checkpoint import GLOBAL, rank_file
from gpuvigil.training.storage import Storage

log = logging.getLogger("gpuvigil.training.checkpoint")

DAMAGED_PREFIX = "damaged-"


@dataclass
class Skipped:
    folder: str
    reason: str  # "uncommitted" | "damaged"
    detail: str


@dataclass
class Choice:
    folder: str | None
    skipped: list[Skipped] = field(default_factory=list)
    verified_files: int = 0  # by this rank
    verified_bytes: int = 0
    verify_s: float = 0.0


@dataclass
class Loaded:
    step: int
    folder: str
    tensors: Any  # the nested model/optimizer state, filled
    own: dict[str, Any] | None  # this rank's saved state; None after a resize
    main: dict[str, Any]  # rank 0's saved state (the fallback for replicated parts)
    job: dict[str, Any]  # global.json


def _broadcast(obj: Any, *, group: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def choose(storage: Storage, *, rank: int, world_size: int, group: Any, checksums: bool) -> Choice:
    """Collective: the newest intact checkpoint, every file verified by some rank."""
    choice = Choice(None)
    folders = _broadcast(
        [f for _, f in manifest.candidates(storage)] if rank == 0 else None, group=group
    )
    for folder in folders:
        table = None
        if rank == 0:
            m, why = manifest.read(storage, folder)
            table = m.data_files() if m is not None else why
        table = _broadcast(table, group=group)
        if isinstance(table, str):
            reason = "uncommitted" if table.startswith("no manifest") else "damaged"
            choice.skipped.append(Skipped(folder, reason, table))
            continue
        t0 = time.monotonic()
        mine = manifest.assign(table, world_size=world_size)[rank]
        problem = ""
        for name in mine:
            problem = manifest.check_file(
                storage, folder, name, table[name], checksums=checksums
            ) or _parses(storage, folder, name)
            if problem:
                break
        spent = time.monotonic() - t0
        nbytes = sum(int(table[n]["size"]) for n in mine)
        verdicts: list[Any] = [None] * world_size
        dist.all_gather_object(verdicts, problem, group=group)
        bad = [v for v in verdicts if v]
        if bad:
            choice.skipped.append(Skipped(folder, "damaged", bad[0]))
            continue
        choice.folder = folder
        choice.verified_files, choice.verified_bytes, choice.verify_s = len(mine), nbytes, spent
        log.info(
            "gpuvigil checkpoint: rank %d verified %d of %d files of %s (%d bytes, %s) in %.3fs",
            rank,
            len(mine),
            len(table),
            folder,
            nbytes,
            "sizes and SHA-256" if checksums else "sizes",
            spent,
        )
        return choice
    return choice


def _parses(storage: Storage, folder: str, name: str) -> str:
    """ "" when a metadata or state file is what this layer writes (JSON); a file that passes
    its checksum but is not (a pickle planted with a forged manifest) is damaged, never
    deserialized by anything that could run code."""
    if name != dcp_storage.METADATA and not name.endswith(".json"):
        return ""  # raw tensor bytes: any bytes are just numbers
    try:
        raw = storage.read_bytes(f"{folder}/{name}")
        if name == dcp_storage.METADATA:
            dcp_storage.metadata_from_json(raw)
        else:
            state_codec.loads(raw)
    except (OSError, ValueError) as e:
        return f"file {name} is not gpuvigil data: {e}"
    return ""


def describe(s: Skipped) -> str:
    if s.reason == "uncommitted":
        return (
            f"gpuvigil checkpoint: {s.folder} was never committed (its save was interrupted); "
            "skipping it"
        )
    return (
        f"gpuvigil checkpoint: {s.folder} is DAMAGED ({s.detail}); falling back to the "
        "previous checkpoint"
    )


class NoVerifiedCheckpoint(SystemExit):
    """Ends the job: checkpoints exist, none verifies (exit_codes.NO_VERIFIED_CHECKPOINT)."""

    def __init__(self, message: str) -> None:
        super().__init__(exit_codes.NO_VERIFIED_CHECKPOINT)
        self.message = message


def refusal(choice: Choice, *, location: str) -> str:
    """ "" when the job may go on (a checkpoint verified, or there was none to verify);
    else the ERROR naming each damaged checkpoint. A folder whose save never committed is
    no checkpoint: a job whose first save was interrupted starts at step 0."""
    damaged = [s for s in choice.skipped if s.reason == "damaged"]
    if choice.folder is not None or not damaged:
        return ""
    each = "; ".join(f"{s.folder}: {s.detail}" for s in damaged)
    return (
        f"gpuvigil checkpoint: {len(damaged)} checkpoint(s) in {location} and none can be "
        f"verified ({each}); refusing to start again at step 0 and exiting with code "
        f"{exit_codes.NO_VERIFIED_CHECKPOINT}. Nothing was deleted. Repair or restore them, or "
        "start from scratch on purpose with --allow-fresh-start "
        "(checkpoint.allow_fresh_start: true)"
    )


def keep_damaged(storage: Storage, skipped: list[Skipped]) -> list[str]:
    """Rank 0: rename each damaged folder `damaged-<folder>` (a number added when that name
    is taken), so neither pruning nor a new save of the same step ever deletes it; returns
    the new names. A rename that fails is logged: the folder then stays where it is."""
    kept = []
    for s in skipped:
        if s.reason != "damaged":
            continue
        names = [f"{DAMAGED_PREFIX}{s.folder}"] + [
            f"{DAMAGED_PREFIX}{s.folder}.{i}" for i in range(2, 100)
        ]
        to = next((n for n in names if not storage.exists(n)), None)
        try:
            if to is None:
                raise FileExistsError(names[-1])
            storage.move(s.folder, to)
        except OSError as e:
            log.error("gpuvigil checkpoint: could not set damaged %s aside: %s", s.folder, e)
            continue
        log.warning(
            "gpuvigil checkpoint: kept the damaged %s as %s (never deleted; remove it by hand "
            "once looked at)",
            s.folder,
            to,
        )
        kept.append(to)
    return kept


def _state(storage: Storage, folder: str, name: str) -> dict[str, Any]:
    value = state_codec.loads(storage.read_bytes(f"{folder}/{name}"))
    if not isinstance(value, dict):
        raise state_codec.StateError(f"{name} is not a state object")
    return value


def load(
    storage: Storage,
    folder: str,
    live: Any,
    *,
    rank: int,
    world_size: int,
    group: Any,
) -> Loaded:
    """Collective: fill `live` (the model/optimizer state as `get_state_dict` gives it now)
    from `folder`, which `choose` verified."""
    main = _state(storage, folder, rank_file(0))
    saved_world = main.get("world_size")
    own = _state(storage, folder, rank_file(rank)) if saved_world == world_size else None
    job = _state(storage, folder, GLOBAL)
    skeleton = (own or main)["skeleton"]
    flat, _ = tensor_tree.split(live)
    wanted = tensor_tree.refs(skeleton)
    unknown = sorted(set(flat) - wanted)
    if unknown:
        raise RuntimeError(
            f"{folder} has no saved value for {len(unknown)} tensors of this model/optimizer "
            f"(first: {unknown[0]}); was the model changed?"
        )
    dcp.load(flat, storage_reader=dcp_storage.Reader(storage, folder), process_group=group)
    tensors = tensor_tree.join(skeleton, flat)
    log.info(
        "gpuvigil checkpoint: resumed from %s (step %d, saved by %d ranks, now %d)",
        storage.path(folder),
        int(job["step"]),
        saved_world,
        world_size,
    )
    return Loaded(int(job["step"]), folder, tensors, own, main, job)
