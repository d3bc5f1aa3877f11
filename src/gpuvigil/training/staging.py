"""The host-memory copy an async save writes from: one arena, reused save after save.

Called by `checkpoint` for async saves. `Stager.stage(tensors)` copies every tensor of the
state (plain tensors and the local shards of DTensors, i.e. FSDP2 and tensor-parallel
state alike) into a slot of one arena and returns the same structure over those slots,
DTensors re-wrapped with their own sharding spec. The arena is a memfd (shared memory the
writer process maps, `writer`), pinned for the GPU when CUDA is present, and it is kept:
after the first save the stall is one copy per tensor, with no allocation, no page faults
and no new pinning. The layout is rebuilt only when a tensor's shape or dtype changes.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger("gpuvigil.training.staging")

_ALIGN = 64


@dataclass(frozen=True)
class Slot:
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: torch.Size


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose bytes a save writes: a DTensor's local shard, else itself."""
    return t._local_tensor if _is_dtensor(t) else t  # type: ignore[attr-defined]


def _is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "_spec") and hasattr(t, "_local_tensor")


def _tensors(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _tensors(v, (*path, k))]
    if isinstance(obj, list | tuple):
        return [x for i, v in enumerate(obj) for x in _tensors(v, (*path, i))]
    return []


class Arena:
    """One block of shared memory (memfd) viewed as a uint8 tensor."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.fd = os.memfd_create("gpuvigil-checkpoint", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self._map = mmap.mmap(self.fd, self.size)
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        self.pinned = False
        if torch.cuda.is_available():  # page-locked: device-to-host copies run at full speed
            try:
                rc = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), self.size, 0)
                self.pinned = int(rc) == 0
            except (RuntimeError, AttributeError) as e:
                log.warning("checkpoint staging arena could not be pinned: %s", e)

    def view(self, slot: Slot) -> torch.Tensor:
        raw = self.tensor[slot.offset : slot.offset + slot.nbytes]
        return raw.view(slot.dtype).reshape(slot.shape)

    def span(self, t: torch.Tensor) -> tuple[int, int] | None:
        """(offset, length) of a contiguous tensor inside the arena, else None."""
        n = t.numel() * t.element_size()
        at = t.data_ptr() - self.tensor.data_ptr()
        if t.device.type != "cpu" or not t.is_contiguous() or at < 0 or at + n > self.size:
            return None
        return at, n

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
        os.close(self.fd)


class Stager:
    def __init__(self) -> None:
        self.arena: Arena | None = None
        self.slots: dict[tuple[Any, ...], Slot] = {}
        self.layouts = 0  # arenas made: 1 in a steady run (the test checks reuse with it)

    def _layout(self, items: list[tuple[tuple[Any, ...], torch.Tensor]]) -> None:
        slots, at = {}, 0
        for path, t in items:
            loc = _local(t)
            n = loc.numel() * loc.element_size()
            slots[path] = Slot(at, n, loc.dtype, loc.shape)
            at += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        old, self.arena = self.arena, Arena(at)
        self.slots = slots
        self.layouts += 1
        if old is not None:
            old.close()

    def prepare(self, obj: Any) -> None:
        """Lay the arena out for `obj`'s tensors and fault every page in, before training
        starts: the first save then copies into memory that exists (creating and touching
        a fresh arena stalled the first async save of each `Run` for seconds)."""
        items = _tensors(obj)
        if items:
            self._layout(items)
            assert self.arena is not None
            self.arena.tensor.fill_(0)

    def stage(self, obj: Any) -> Any:
        """A copy of `obj` whose tensors live in the arena (the caller synchronizes CUDA)."""
        items = _tensors(obj)
        fits = self.arena is not None and len(items) == len(self.slots)
        for path, t in items if fits else ():
            s, loc = self.slots.get(path), _local(t)
            if s is None or s.shape != loc.shape or s.dtype != loc.dtype:
                fits = False
                break
        if not fits:
            self._layout(items)
        assert self.arena is not None
        return self._copy(obj, ())

    def _copy(self, obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            assert self.arena is not None
            loc = _local(obj)
            buf = self.arena.view(self.slots[path])
            buf.copy_(loc.detach(), non_blocking=loc.is_cuda)
            if _is_dtensor(obj):
                from torch.distributed.tensor import DTensor

                return DTensor(buf, obj._spec, requires_grad=False)  # type: ignore[attr-defined]
            return buf
        if isinstance(obj, dict):
            return {k: self._copy(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self._copy(v, (*path, i)) for i, v in enumerate(obj))
        return obj

    def close(self) -> None:
        if self.arena is not None:
            self.arena.close()
            self.arena = None
