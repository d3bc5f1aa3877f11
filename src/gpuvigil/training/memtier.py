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

A save holds the training thread only for the snapshot: the header and a copy of every
tensor's bytes into a host buffer (kept and reused while the sizes match), what has to
happen before the next optimizer step changes them. The tier's own thread (one per
`MemTier`, started on the first save) then hashes, writes the own copy, exchanges with the
peer and writes the peer's copy, as the async DCP writer does. One copy at a time: the
next save, `restore` and `close` first wait for it (at most `wait_s`), so the `memtier`
group is never used by two threads at once and every rank's exchanges come in step order.
A copy that fails is reported (WARNING) by that wait; the tier then holds the step before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import struct
import threading
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
    header, sizes = _header(step, flat, state)
    out = bytearray(_prefix(header) + sum(sizes) + _SUM)
    _fill(memoryview(out), header, flat, sizes)
    _seal(memoryview(out))
    return out


def _header(
    step: int, flat: dict[str, torch.Tensor], state: dict[str, Any]
) -> tuple[bytes, list[int]]:
    """The blob's header, and the bytes of each tensor in it."""
    table, sizes, offset = [], [], 0
    for name, t in flat.items():
        nbytes = t.numel() * t.element_size()
        table.append([name, str(t.dtype), list(t.shape), offset, nbytes])
        sizes.append(nbytes)
        offset += nbytes
    return state_codec.dumps({"step": step, "tensors": table, **state}), sizes


def _prefix(header: bytes) -> int:
    return len(MAGIC) + _LEN.size + len(header)


def _fill(view: memoryview, header: bytes, flat: dict[str, torch.Tensor], sizes: list[int]) -> None:
    """Write everything but the sum into `view` (the blob's length exactly): the snapshot."""
    at = 0
    for piece in (MAGIC, _LEN.pack(len(header)), header):
        view[at : at + len(piece)] = piece
        at += len(piece)
    for t, n in zip(flat.values(), sizes, strict=True):
        if n:  # straight into the buffer: from a GPU too, no host tensor in between
            dst = torch.frombuffer(view[at : at + n], dtype=torch.uint8)
            dst.copy_(dcp_storage.tensor_bytes(t.detach().contiguous()))
        at += n


def _seal(view: memoryview) -> None:
    body = len(view) - _SUM
    view[body:] = hashlib.sha256(view[:body]).digest()


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


WAIT_S = 300.0  # how long a save, a restore or close waits for the copy in flight


@dataclass
class Copy:
    """One copy handed to the tier's thread: `blob` is its place in the snapshot buffer."""

    step: int
    blob: memoryview
    done: threading.Event
    error: BaseException | None = None


class MemTier:
    def __init__(
        self,
        config: MemTierConfig,
        *,
        rank: int,
        world_size: int,
        group: Any,
        job: str,
        node: str,
        wait_s: float = WAIT_S,
    ) -> None:
        self.config, self.wait_s = config, wait_s
        self.rank, self.world_size, self.group = rank, world_size, group
        # torchrun's LOCAL_WORLD_SIZE: the peer is a node's worth of ranks away (tier_choice)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        self.offset = tier_choice.peer_offset(world_size, local)
        self.peer = tier_choice.peer_of(rank, world_size, self.offset)  # holds my copy
        self.ward = tier_choice.ward_of(rank, world_size, self.offset)  # whose copy I hold
        self.holder = Path(config.dir.format(job=job or "job", node=node, rank=rank))
        self.holder.mkdir(parents=True, exist_ok=True)
        self.held: int | None = None  # the newest step whose copy this rank completed
        self.failures = 0  # copies that failed, reported by `wait`
        self._buf: bytearray | None = None  # the snapshot buffer: reserve, then the tensors
        self._reserve = self._payload = 0
        self._inflight: Copy | None = None
        self._queue: queue.Queue[Copy | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    # --- save ---------------------------------------------------------------------------
    def save(self, step: int, tensors: Any, state: dict[str, Any]) -> int:
        """Snapshot this rank's state of `step` and hand it to the tier's thread, which keeps
        it here and on the peer; returns the blob's bytes (0: skipped, the previous copy is
        still in flight after `wait_s`). Waits for the previous copy first."""
        if not self.wait():
            log.warning("gpuvigil memtier: rank %d skips the copy of step %d", self.rank, step)
            return 0
        flat, skeleton = tensor_tree.split(tensors)
        header, sizes = _header(step, flat, {"skeleton": skeleton, **state})
        blob = self._snapshot_view(_prefix(header), sum(sizes))
        _fill(blob, header, flat, sizes)
        self._inflight = Copy(step, blob, threading.Event())
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, name=f"gpuvigil-memtier-r{self.rank}", daemon=True
            )
            self._thread.start()
        self._queue.put(self._inflight)
        return len(blob)

    @property
    def in_flight(self) -> int | None:
        """The step whose copy the tier's thread is still making, if any."""
        c = self._inflight
        return c.step if c is not None and not c.done.is_set() else None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the copy in flight (at most `timeout`, default `wait_s`); False if it is
        still not done. Reports a copy that failed (WARNING), once; never raises."""
        c = self._inflight
        if c is None:
            return True
        limit = self.wait_s if timeout is None else timeout
        if not c.done.wait(limit):
            log.warning(
                "gpuvigil memtier: rank %d's copy of step %d is not done after %.0fs; "
                "the tier holds step %s",
                self.rank,
                c.step,
                limit,
                self.held,
            )
            return False
        self._inflight = None
        if c.error is None:
            self.held = c.step
        else:
            self.failures += 1
            log.warning(
                "gpuvigil memtier: rank %d's copy of step %d failed (%s: %s); the tier "
                "holds step %s",
                self.rank,
                c.step,
                type(c.error).__name__,
                c.error,
                self.held,
            )
        return True

    def close(self) -> None:
        """Wait for the copy in flight (bounded) and stop the tier's thread."""
        self.wait()
        if self._thread is not None and self._inflight is None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def _snapshot_view(self, prefix: int, payload: int) -> memoryview:
        """The blob's place in the snapshot buffer, kept while the tensors' bytes are the
        same: the header ends at a fixed reserve and the tensors follow it, so a header that
        grows (the step, the step times) does not make a new buffer of the whole state."""
        if self._buf is None or payload != self._payload or prefix > self._reserve:
            self._buf = None  # the old one goes before the new one is made
            self._reserve, self._payload = max(2 * prefix, 1 << 16), payload
            self._buf = bytearray(self._reserve + payload + _SUM)
        return memoryview(self._buf)[self._reserve - prefix :]

    def _loop(self) -> None:
        while (c := self._queue.get()) is not None:
            try:
                self._copy(c)
            except Exception as e:  # noqa: BLE001 - kept for `wait` to report, never lost
                c.error = e
            finally:
                c.done.set()

    def _copy(self, c: Copy) -> None:
        """Hash, write the own copy, exchange with the peer, write the peer's copy (the
        tier's thread). The exchange happens even when the own write failed, so the peers'
        point-to-point pairs still match."""
        t0 = time.monotonic()
        _seal(c.blob)
        problem: OSError | None = None
        try:
            self._put("own", self.rank, c.step, c.blob)
        except OSError as e:
            problem = e
        if self.world_size > 1:
            theirs = self._exchange(c.blob, send_to=self.peer, recv_from=self.ward)
            self._put("peer", self.ward, c.step, theirs)
        if problem is not None:
            raise problem
        log.debug(
            "gpuvigil memtier: rank %d copied step %d in %.3fs",
            self.rank,
            c.step,
            time.monotonic() - t0,
        )

    def _exchange(
        self,
        blob: bytes | bytearray | memoryview | None,
        *,
        send_to: int | None,
        recv_from: int | None,
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
            ours = isinstance(blob, bytearray) or (
                isinstance(blob, memoryview) and not blob.readonly
            )
            writable = blob if ours else bytearray(blob)
            out = torch.frombuffer(writable, dtype=torch.uint8)
            reqs.append(dist.isend(out, dst=send_to, group=self.group))
        for r in reqs:
            r.wait()
        return buf

    def _put(self, kind: str, owner: int, step: int, blob: bytes | bytearray | memoryview) -> None:
        path = self.holder / _name(kind, owner, step)
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_bytes(blob)
            os.replace(tmp, path)  # a copy is whole or absent
        except OSError:
            tmp.unlink(missing_ok=True)  # no half copy left holding host memory
            raise
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
        one its peer holds, fetched), or (None, why not). Waits for the copy in flight."""
        if not self.wait():
            return None, f"this rank's copy of step {self.in_flight} is still in flight"
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
