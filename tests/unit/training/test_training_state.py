"""Checkpoint state without pickle: the JSON codec, DCP's metadata as JSON, the writer that
hashes while it writes (in this process and in its own), and the staging arena's reuse."""

from __future__ import annotations

import hashlib
import os
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpuvigil.training import dcp_storage, rng, state_codec, tensor_tree
from gpuvigil.training.staging import Stager
from gpuvigil.training.storage import LocalStorage
from gpuvigil.training.writer import WriterProcess, write_file


def test_rng_states_round_trip_through_json() -> None:
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    saved = state_codec.loads(state_codec.dumps(rng.capture()))
    expect = (random.random(), np.random.rand(), torch.rand(1).item())
    rng.restore(saved)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expect


def test_codec_keeps_types_json_lacks() -> None:
    value = {
        "t": (1, 2.5, None),
        "b": b"\x00\xff",
        "x": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "n": np.arange(4, dtype=np.uint32),
        "k": {1: "int key", (2, 3): "tuple key"},
        "f": [float("inf"), float("nan")],
        "e": torch.empty(0),
    }
    back = state_codec.loads(state_codec.dumps(value))
    assert back["t"] == (1, 2.5, None) and back["b"] == b"\x00\xff"
    assert torch.equal(back["x"], value["x"]) and back["x"].dtype == torch.bfloat16
    assert (back["n"] == value["n"]).all() and back["n"].dtype == np.uint32
    assert back["k"] == {1: "int key", (2, 3): "tuple key"}
    assert back["f"][0] == float("inf") and back["f"][1] != back["f"][1]
    assert back["e"].shape == (0,)


def test_codec_refuses_what_only_pickle_could_keep() -> None:
    with pytest.raises(state_codec.StateError, match=r"\.extra\.fn: a builtins.function"):
        state_codec.dumps({"extra": {"fn": lambda: None}})
    with pytest.raises(state_codec.StateError, match="numpy array of Python objects"):
        state_codec.dumps(np.array([object()]))


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("false",))


@pytest.mark.parametrize(
    "raw",
    [
        pickle.dumps(_Payload()),
        b"",
        b"\x80\x04K\x01.",
        b'{"__gv__": "pickle", "b64": ""}',
        b'{"__gv__": "tensor", "dtype": "os.system", "shape": [], "b64": ""}',
    ],
)
def test_codec_refuses_anything_it_did_not_write(raw: bytes) -> None:
    with pytest.raises(state_codec.StateError):
        state_codec.loads(raw)


def test_split_and_join_a_nested_state() -> None:
    state = {
        "model": {"w": torch.ones(2)},
        "optim": {
            "param_groups": [{"lr": 0.1, "params": ["w"]}],
            "state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}},
        },
    }
    flat, skeleton = tensor_tree.split(state)
    assert set(flat) == {"model/w", "optim/state/w/step", "optim/state/w/exp_avg"}
    skeleton = state_codec.loads(state_codec.dumps(skeleton))  # as saved
    back = tensor_tree.join(skeleton, flat)
    assert back["optim"]["param_groups"] == [{"lr": 0.1, "params": ["w"]}]
    assert back["model"]["w"] is flat["model/w"]
    assert tensor_tree.refs(skeleton) == set(flat)


def test_dcp_metadata_is_json_and_a_pickled_metadata_is_refused_unread() -> None:
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    md = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                TensorProperties(dtype=torch.bfloat16),
                torch.Size([4, 2]),
                [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([4, 2]))],
            )
        },
        storage_data={MetadataIndex("w", [0, 0]): dcp_storage.Piece("__0_0.distcp", 0, 16)},
    )
    back = dcp_storage.metadata_from_json(dcp_storage.metadata_to_json(md))
    assert back.state_dict_metadata == md.state_dict_metadata
    assert back.storage_data == md.storage_data
    with pytest.raises(ValueError, match="a pickled .metadata is never loaded"):
        dcp_storage.metadata_from_json(pickle.dumps(md))
    with pytest.raises(ValueError, match="not a torch dtype"):
        dcp_storage.metadata_from_json(
            dcp_storage.metadata_to_json(md).replace(b"torch.bfloat16", b"os.system")
        )


def test_write_file_hashes_what_it_writes(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    parts = [b"a" * 10, bytes(range(256)) * 40_000, b""]
    got = write_file(storage, "step-1/x.bin", [memoryview(p) for p in parts])
    data = (tmp_path / "step-1" / "x.bin").read_bytes()
    assert data == b"".join(parts)
    assert got == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_the_writer_process_writes_from_the_staging_arena(tmp_path: Path) -> None:
    state = {
        "a": torch.arange(1000, dtype=torch.float32),
        "b": torch.ones(3, 5, dtype=torch.bfloat16),
    }
    stager = Stager()
    staged = stager.stage(state)
    arena = stager.arena
    assert arena is not None
    proc = WriterProcess()
    try:
        proc.use_arena(arena.fd, arena.size)
        spans = [arena.span(staged["a"]), arena.span(staged["b"])]
        assert None not in spans
        got = proc.write(str(tmp_path), "step-1/__0_0.distcp", spans)  # type: ignore[arg-type]
    finally:
        proc.close()
    want = b"".join(dcp_storage.tensor_bytes(t).numpy().tobytes() for t in state.values())
    assert (tmp_path / "step-1" / "__0_0.distcp").read_bytes() == want
    assert got == {"size": len(want), "sha256": hashlib.sha256(want).hexdigest()}
    assert proc.proc.returncode == 0  # it left when its socket closed


def test_the_writer_process_reports_a_failed_write(tmp_path: Path) -> None:
    (tmp_path / "step-1").write_text("a file where the folder should be")
    stager = Stager()
    staged = stager.stage({"a": torch.ones(4)})
    proc = WriterProcess()
    try:
        assert stager.arena is not None
        proc.use_arena(stager.arena.fd, stager.arena.size)
        with pytest.raises(OSError, match="checkpoint writer process: .*Error"):
            proc.write(str(tmp_path), "step-1/__0_0.distcp", [stager.arena.span(staged["a"])])  # type: ignore[list-item]
    finally:
        proc.close()


def test_staging_reuses_one_arena_save_after_save() -> None:
    state = {"w": torch.randn(64, 64), "opt": [torch.zeros(64), {"step": torch.tensor(1.0)}]}
    stager = Stager()
    first = stager.stage(state)
    ptr = first["w"].data_ptr()
    state["w"].add_(1.0)
    second = stager.stage(state)
    assert stager.layouts == 1 and second["w"].data_ptr() == ptr  # no new allocation
    assert torch.equal(second["w"], state["w"]) and torch.equal(
        second["opt"][1]["step"], torch.tensor(1.0)
    )
    state["w"] = torch.randn(32, 64)  # a new shape: a new layout, once
    stager.stage(state)
    assert stager.layouts == 2
    stager.close()


def test_a_prepared_arena_is_the_one_the_first_save_uses() -> None:
    """`prepare` (before training starts) lays out and touches the arena; the first stage
    reuses it: no arena is made on the training thread's first save."""
    st = Stager()
    try:
        state = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3)}
        st.prepare(state)
        assert st.layouts == 1 and st.arena is not None
        out = st.stage(state)
        assert st.layouts == 1  # reused
        assert torch.equal(out["w"], state["w"]) and torch.equal(out["b"], state["b"])
    finally:
        st.close()
