"""The in-memory checkpoint tier: every K steps, each rank's state in host memory, on its own
node and on a peer's, so losing one machine loses at most K steps (DCP stays the second tier).

Called by `run.Run`. Anchor: the local/in-memory checkpointing of nvidia-resiliency-ext
(each rank's shard kept in node-local storage and replicated to peers) and Gemini's
(SOSP '23) checkpoints in CPU memory with a replica on another machine; no code is taken
from either. What it covers, honestly:
- a copy is a file in the node's holder folder (`memtier.dir`, tmpfs `/dev/shm` by default):
  host memory that outlives the training process, so a worker restarted on the same node
  (torchrun restarts every worker of the gang) finds its own copy;
- rank r also sends its copy to its peer, rank (r + L) % world where L is the ranks per
  node (torchrun's LOCAL_WORLD_SIZE; 1 on a one-node job: `tier_choice`), which keeps it
  in *its* holder folder:
  when r's machine is lost (its process and its tmpfs), the replacement rank r fetches it
  from that peer. Losing a rank and its peer together (two machines at once) loses the tier:
  the resume then falls back to the persistent DCP checkpoint, and says so.
- It does not survive a reboot of every node (tmpfs), nor a resize (the copies are per rank).
The peer copy goes point-to-point over the job's gloo side group `memtier`; on GPUs in
production the same send/recv runs on CPU tensors over gloo (or over NCCL from pinned host
buffers). The peer is on another node when ranks are placed node by node, as torchrun
places them.

A copy is one blob: magic, a JSON header (`state_codec`: step, skeleton, the rank's and the
job's state, the table of tensors) and the raw tensor bytes, then the SHA-256 of everything
before it. A copy is loaded only if its sum verifies and every rank has a verified copy of
the same step (gathered): else the whole tier is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from gpuvigil.training import dcp_storage, state_codec, tensor_tree, tier_choice
from gpuvigil.training.config import MemTierConfig

log = logging.getLogger("gpuvigil.training.checkpoint")

MAGIC = b"GVMEM01\n"
_LEN = struct.Struct("<Q")
_SUM = 32


class Damaged(ValueError):
    """A copy that is not a whole, verified blob of ours."""


def pack(step: int, flat: dict[str, torch.Tensor], state: dict[str, Any]) -> bytearray:
    table, parts, offset = [], [], 0
    for name, t in flat.items():
        raw = dcp_storage.tensor_bytes(t.detach().cpu().contiguous()).numpy()
        table.append([name, str(t.dtype), list(t.shape), offset, raw.nbytes])
        parts.append(raw)
        offset += raw.nbytes
    header = state_codec.dumps({"step": step, "tensors": table, **state})
    h = hashlib.sha256()
    out = bytearray(len(MAGIC) + _LEN.size + len(header) + offset + _SUM)
    view, at = memoryview(out), 0
    for piece in (MAGIC, _LEN.pack(len(header)), header, *parts):
        n = len(piece) if not hasattr(piece, "nbytes") else piece.nbytes
        view[at : at + n] = memoryview(piece).cast("B")
        at += n
    h.update(view[:at])
    view[at:] = h.digest()
    return out


def unpack(blob: bytes | bytearray) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The header and the tensors of a verified blob; raises Damaged."""
    if len(blob) < len(MAGIC) + _LEN.size + _SUM or not blob.startswith(MAGIC):
        raise Damaged("not an in-memory copy (bad magic or too short)")
    body = memoryview(blob)[:-_SUM]
    if hashlib.sha256(body).digest() != bytes(blob[-_SUM:]):
        raise Damaged("SHA-256 mismatch")
    (n,) = _LEN.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        header = state_codec.loads(bytes(body[start : start + n]))
    except state_codec.StateError as e:
        raise Damaged(f"header: {e}") from e
    payload = body[start + n :]
    flat = {}
    for name, dtype, shape, offset, nbytes in header["tensors"]:
        raw = bytearray(payload[offset : offset + nbytes])
        dt = getattr(torch, str(dtype).removeprefix("torch."))
        flat[name] = (
            torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(shape)
            if nbytes
            else torch.empty(shape, dtype=dt)
        )
    return header, flat


@dataclass
class Restored:
    step: int
    header: dict[str, Any]  # the rank's state: skeleton, rank_state, job
    flat: dict[str, torch.Tensor]
    fetched: bool  # this rank's copy came from its peer


def _name(kind: str, owner: int, step: int) -> str:
    return f"{kind}-r{owner:05d}-s{step:09d}.bin"


def _parse(name: str) -> tuple[str, int, int] | None:
    try:
        kind, r, s = name.removesuffix(".bin").split("-")
        return kind, int(r[1:]), int(s[1:])
    except ValueError:
        return None


class MemTier:
    def __init__(
        self, config: MemTierConfig, *, rank: int, world_size: int, group: Any, job: str, node: str
    ) -> None:
        self.config = config
        self.rank, self.world_size, self.group = rank, world_size, group
        # torchrun's LOCAL_WORLD_SIZE: the peer is a node's worth of ranks away (tier_choice)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        self.offset = tier_choice.peer_offset(world_size, local)
        self.peer = tier_choice.peer_of(rank, world_size, self.offset)  # holds my copy
        self.ward = tier_choice.ward_of(rank, world_size, self.offset)  # whose copy I hold
        self.holder = Path(config.dir.format(job=job or "job", node=node, rank=rank))
        self.holder.mkdir(parents=True, exist_ok=True)

    # --- save ---------------------------------------------------------------------------
    def save(self, step: int, tensors: Any, state: dict[str, Any]) -> int:
        """Keep this rank's copy of `step` here and on its peer; returns the blob's bytes.
        Collective (point-to-point with both neighbours)."""
        flat, skeleton = tensor_tree.split(tensors)
        blob = pack(step, flat, {"skeleton": skeleton, **state})
        self._put("own", self.rank, step, blob)
        if self.world_size > 1:
            theirs = self._exchange(blob, send_to=self.peer, recv_from=self.ward)
            self._put("peer", self.ward, step, theirs)
        return len(blob)

    def _exchange(
        self, blob: bytes | bytearray | None, *, send_to: int | None, recv_from: int | None
    ) -> bytearray:
        """Send `blob` to one rank and receive one from another (either may be None)."""
        size_in = torch.zeros(1, dtype=torch.int64)
        reqs = []
        if recv_from is not None:
            reqs.append(dist.irecv(size_in, src=recv_from, group=self.group))
        if send_to is not None and blob is not None:
            size_out = torch.tensor([len(blob)], dtype=torch.int64)
            reqs.append(dist.isend(size_out, dst=send_to, group=self.group))
        for r in reqs:
            r.wait()
        # received straight into the bytearray returned: no copy of a copy (a 200 MB copy
        # took 0.44 s more through numpy's tobytes)
        buf = bytearray(int(size_in.item()))
        reqs = []
        if recv_from is not None and buf:
            data_in = torch.frombuffer(buf, dtype=torch.uint8)
            reqs.append(dist.irecv(data_in, src=recv_from, group=self.group))
        if send_to is not None and blob is not None:
            writable = blob if isinstance(blob, bytearray) else bytearray(blob)
            out = torch.frombuffer(writable, dtype=torch.uint8)
            reqs.append(dist.isend(out, dst=send_to, group=self.group))
        for r in reqs:
            r.wait()
        return buf

    def _put(self, kind: str, owner: int, step: int, blob: bytes | bytearray) -> None:
        path = self.holder / _name(kind, owner, step)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # a copy is whole or absent
        steps = sorted(s for s, p in self._copies(kind, owner).items())
        for old in steps[: -self.config.keep_last]:
            (self.holder / _name(kind, owner, old)).unlink(missing_ok=True)

    def _copies(self, kind: str, owner: int) -> dict[int, Path]:
        out = {}
        for p in self.holder.glob("*.bin") if self.holder.is_dir() else []:
            parsed = _parse(p.name)
            if parsed and parsed[0] == kind and parsed[1] == owner:
                out[parsed[2]] = p
        return out

    def _verified(self, kind: str, owner: int) -> dict[int, bytes]:
        """This holder's copies of `owner` whose sum, step, rank and world size check."""
        good = {}
        for step, path in self._copies(kind, owner).items():
            try:
                blob = path.read_bytes()
                header, _ = unpack(blob)
                if int(header["step"]) != step or int(header["rank"]) != owner:
                    raise Damaged(f"holds step {header['step']} of rank {header['rank']}")
                if int(header["world_size"]) != self.world_size:
                    raise Damaged(f"saved by {header['world_size']} ranks")
            except (OSError, Damaged, KeyError, TypeError, ValueError) as e:
                log.warning("gpuvigil memtier: %s is DAMAGED (%s); not used", path, e)
                continue
            good[step] = blob
        return good

    # --- restore ------------------------------------------------------------------------
    def restore(self, live_keys: set[str]) -> tuple[Restored | None, str]:
        """Collective: the newest step every rank has a verified copy of (its own, or the
        one its peer holds, fetched), or (None, why not)."""
        t0 = time.monotonic()
        own, held = self._verified("own", self.rank), self._verified("peer", self.ward)
        views: list[Any] = [None] * self.world_size
        dist.all_gather_object(views, (sorted(own), sorted(held)), group=self.group)
        owns, helds = [v[0] for v in views], [v[1] for v in views]
        found = tier_choice.newest_common(owns, helds, self.offset)
        if found is None:
            have = tier_choice.reachable(owns, helds, self.offset)
            lost = [q for q in range(self.world_size) if not have[q]]
            why = (
                f"no step that every rank has a verified copy of (ranks with none: {lost}; "
                f"steps per rank: {[sorted(h) for h in have]})"
            )
            return None, why
        step = found
        needs = [step not in views[q][0] for q in range(self.world_size)]
        blob = own.get(step)
        fetched = blob is None
        if self.world_size > 1 and any(needs):
            got = self._exchange(
                held.get(step) if needs[self.ward] else None,
                send_to=self.ward if needs[self.ward] else None,
                recv_from=self.peer if needs[self.rank] else None,
            )
            if needs[self.rank]:
                blob = got
        problem = ""
        header: dict[str, Any] = {}
        flat: dict[str, torch.Tensor] = {}
        try:
            assert blob is not None
            header, flat = unpack(blob)
            missing = sorted(live_keys - set(flat))
            if missing:
                problem = f"no saved value for {len(missing)} tensors (first: {missing[0]})"
        except (Damaged, AssertionError) as e:
            problem = f"rank {self.rank}'s copy of step {step}: {e}"
        verdicts: list[Any] = [None] * self.world_size
        dist.all_gather_object(verdicts, problem, group=self.group)
        bad = [v for v in verdicts if v]
        if bad:
            return None, f"step {step}: {bad[0]}"
        if fetched:
            assert blob is not None
            self._put("own", self.rank, step, blob)  # this node holds its own copy again
        log.info(
            "gpuvigil memtier: rank %d restored step %d from %s in %.3fs",
            self.rank,
            step,
            f"its peer rank {self.peer}" if fetched else f"its own copy in {self.holder}",
            time.monotonic() - t0,
        )
        return Restored(step, header, flat, fetched), ""
