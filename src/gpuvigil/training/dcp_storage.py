"""DCP's storage layer, gpuvigil's way: raw tensor bytes, JSON metadata, nothing pickled.

Called by `checkpoint`. DCP (torch.distributed.checkpoint) plans a save or a load across
ranks (deduplication of replicated tensors, resharding at any world size); this module is
the storage it plans against. Why not DCP's FileSystemWriter/Reader: its `.metadata` is a
pickle (`pickle.load` on load) and non-tensor values go through `torch.load(weights_only=
False)`, so whoever can write the checkpoint store runs code on every rank. Here:

- each rank's tensors are one file `__R_0.distcp` of raw, contiguous tensor bytes; where
  each piece lies (offset, length) is in the metadata, which is JSON;
- the bytes go to storage through a `Sink` that hashes them on the way (SHA-256), in this
  process (sync saves) or in the rank's writer process (async saves, `writer`): a file is
  read exactly once, when it is written, to make its checksum;
- non-tensor values are refused (`checkpoint` keeps them in JSON state files instead);
- loading reads bytes into tensors of the dtype and shape the metadata names: no
  deserializer ever sees checkpoint bytes.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from gpuvigil.training.storage import Storage

METADATA = ".metadata"
FORMAT = "gpuvigil.dcp/1"

# (file name relative to the checkpoint folder, [tensor, ...]) -> {file: {"size", "sha256"}}
Sink = Callable[[str, list[torch.Tensor]], dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Piece:
    """Where one saved tensor chunk lies: DCP's storage_data for this layer."""

    file: str
    offset: int
    length: int


def data_file(rank: int) -> str:
    return f"__{rank}_0.distcp"


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dt


def _ints(xs: Any) -> list[int]:
    if not isinstance(xs, list) or not all(type(x) is int and x >= 0 for x in xs):
        raise ValueError(f"expected a list of non-negative integers, got {xs!r}")
    return list(xs)


def metadata_to_json(md: Metadata) -> bytes:
    tensors = {}
    for fqn, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            raise ValueError(f"{fqn}: non-tensor entries are never saved through DCP here")
        tensors[fqn] = {
            "dtype": str(m.properties.dtype),
            "size": list(m.size),
            "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in m.chunks],
        }
    pieces = [
        {
            "fqn": idx.fqn,
            "offset": list(idx.offset or ()),
            "file": p.file,
            "at": p.offset,
            "length": p.length,
        }
        for idx, p in (md.storage_data or {}).items()
    ]
    body = {"format": FORMAT, "version": md.version, "tensors": tensors, "pieces": pieces}
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def metadata_from_json(raw: bytes) -> Metadata:
    """Raises ValueError on anything but metadata this module wrote."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(
            f"DCP metadata is not JSON ({e}): a pickled .metadata is never loaded"
        ) from e
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ValueError("not gpuvigil DCP metadata (a pickled .metadata is never loaded)")
    try:
        sd: dict[str, Any] = {}
        for fqn, t in body["tensors"].items():
            chunks = [
                ChunkStorageMetadata(
                    offsets=torch.Size(_ints(c["offsets"])), sizes=torch.Size(_ints(c["sizes"]))
                )
                for c in t["chunks"]
            ]
            sd[str(fqn)] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_dtype(str(t["dtype"]))),
                size=torch.Size(_ints(t["size"])),
                chunks=chunks,
            )
        storage = {
            MetadataIndex(str(p["fqn"]), _ints(p["offset"])): Piece(
                str(p["file"]), _ints([p["at"]])[0], _ints([p["length"]])[0]
            )
            for p in body["pieces"]
        }
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"DCP metadata field missing or wrong: {e!r}") from e
    return Metadata(state_dict_metadata=sd, storage_data=storage, version=body.get("version"))


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous CPU tensor (any dtype, bfloat16 included)."""
    return t.reshape(-1).view(torch.uint8)


class Writer(StorageWriter):
    """Saves through `sink`; rank 0 writes the JSON metadata. `digests` collects what this
    rank wrote ({file: {size, sha256}}), for the manifest."""

    def __init__(self, storage: Storage, folder: str, *, sink: Sink) -> None:
        super().__init__()
        self.storage, self.folder, self.sink = storage, folder, sink
        self.rank = 0
        self.digests: dict[str, dict[str, Any]] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self.digests = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        bad = [i.index.fqn for i in plan.items if i.type == WriteItemType.BYTE_IO]
        if bad:
            raise ValueError(f"non-tensor values reached DCP (kept as JSON instead): {bad[:3]}")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        name = data_file(self.rank)
        pieces: list[torch.Tensor] = []
        results = []
        at = 0
        for item in plan.items:
            t = planner.resolve_data(item)
            assert isinstance(t, torch.Tensor)
            t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            n = t.numel() * t.element_size()
            pieces.append(t)
            results.append(
                WriteResult(index=item.index, size_in_bytes=n, storage_data=Piece(name, at, n))
            )
            at += n
        self.digests[name] = self.sink(f"{self.folder}/{name}", pieces)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {wr.index: wr.storage_data for rs in results for wr in rs}
        raw = metadata_to_json(metadata)
        self.storage.write_atomic(f"{self.folder}/{METADATA}", raw)
        self.digests[METADATA] = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    def storage_meta(self) -> Any:
        return None


def _whole_into(target: torch.Tensor, req: Any, dtype: torch.dtype, sizes: torch.Size) -> bool:
    """The saved piece is exactly `target`: a contiguous CPU tensor of its dtype and shape,
    the piece not narrowed (same sharding as at save), so its bytes can be read in place."""
    return (
        target.device.type == "cpu"
        and target.is_contiguous()
        and target.dtype == dtype
        and target.size() == sizes
        and tuple(req.lengths) == tuple(sizes)
        and not any(req.storage_offsets)
    )


def _writable(target: torch.Tensor, nbytes: int) -> Any:
    """A writable buffer over a contiguous CPU tensor's storage (what `readinto` fills)."""
    return (ctypes.c_char * nbytes).from_address(target.data_ptr())


class Reader(StorageReader):
    """Loads what `Writer` saved; refuses anything else."""

    def __init__(self, storage: Storage, folder: str) -> None:
        super().__init__()
        self.storage, self.folder = storage, folder
        self.metadata: Metadata | None = None
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[torch.dtype, torch.Size]] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.metadata is None:
            self.metadata = metadata_from_json(self.storage.read_bytes(f"{self.folder}/{METADATA}"))
        return self.metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self._chunks = {}
        for fqn, m in metadata.state_dict_metadata.items():
            assert isinstance(m, TensorStorageMetadata)
            for c in m.chunks:
                self._chunks[(fqn, tuple(c.offsets))] = (m.properties.dtype, c.sizes)
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        assert self.metadata is not None
        by_file: dict[str, list[Any]] = {}
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                raise ValueError(f"{req.dest_index.fqn}: non-tensor value in a DCP checkpoint")
            piece = self.metadata.storage_data[req.storage_index]
            by_file.setdefault(piece.file, []).append((piece, req))
        for name, reqs in by_file.items():
            with self.storage.open_read(f"{self.folder}/{name}") as fh:
                for piece, req in sorted(reqs, key=lambda pr: pr[0].offset):
                    dtype, sizes = self._chunks[
                        (req.storage_index.fqn, tuple(req.storage_index.offset))
                    ]
                    fh.seek(piece.offset)
                    need = sizes.numel() * torch.empty((), dtype=dtype).element_size()
                    target = planner.resolve_tensor(req).detach()
                    if piece.length == need and _whole_into(target, req, dtype, sizes):
                        # read straight into the model's tensor: no buffer, no second copy
                        got = fh.readinto(_writable(target, need))
                        if got != need:
                            raise ValueError(f"{name}: {req.storage_index.fqn} is truncated")
                        planner.commit_tensor(req, target)
                        continue
                    raw = bytearray(piece.length)
                    got = fh.readinto(raw)
                    if got != piece.length or piece.length != need:
                        raise ValueError(f"{name}: {req.storage_index.fqn} is truncated")
                    src = (
                        torch.frombuffer(raw, dtype=torch.uint8)
                        if raw
                        else torch.empty(0, dtype=torch.uint8)
                    )
                    tensor = src.view(dtype).reshape(sizes)
                    tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                    if target.size() != tensor.size():
                        raise ValueError(
                            f"{req.storage_index.fqn}: shape {tuple(tensor.size())} in the "
                            f"checkpoint, {tuple(target.size())} in the model"
                        )
                    target.copy_(tensor)
                    planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
