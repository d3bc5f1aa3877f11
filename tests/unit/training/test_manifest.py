"""Manifest: commit record, verification of sizes and checksums, fallback order, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.training import manifest
from gpuvigil.training.storage import FsspecStorage, LocalStorage, Storage


def make_ckpt(storage: Storage, step: int, *, commit: bool = True) -> str:
    folder = storage.join(manifest.dir_name(step))
    storage.makedirs(folder)
    storage.write_atomic(storage.join(folder, ".metadata"), b"meta" * 10)
    storage.write_atomic(storage.join(folder, "__0_0.distcp"), bytes(range(256)) * 4)
    storage.write_atomic(storage.join(folder, "rank-00000.pt"), b"rank0")
    if commit:
        m = manifest.build(storage, folder, step=step, world_size=1, checksums=True, created_ts=1.0)
        storage.write_atomic(storage.join(folder, manifest.MANIFEST), m.to_json())
    return folder


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return LocalStorage(str(tmp_path / "ckpt"))
    pytest.importorskip("fsspec")
    return FsspecStorage(f"memory://gv-{tmp_path.name}/ckpt")


def test_committed_checkpoint_verifies(storage: Storage) -> None:
    folder = make_ckpt(storage, 10)
    m, why = manifest.verify(storage, folder)
    assert why == "" and m is not None
    assert m.step == 10 and set(m.files) == {".metadata", "__0_0.distcp", "rank-00000.pt"}
    assert all(len(e["sha256"]) == 64 for e in m.files.values())


def test_uncommitted_is_not_loadable(storage: Storage) -> None:
    folder = make_ckpt(storage, 10, commit=False)
    assert manifest.verify(storage, folder) == (None, "no manifest (the save never committed)")


def test_flipped_byte_is_caught_by_checksum(storage: Storage) -> None:
    folder = make_ckpt(storage, 10)
    path = storage.join(folder, "__0_0.distcp")
    data = bytearray(storage.read_bytes(path))
    data[100] ^= 0xFF
    storage.write_atomic(path, bytes(data))
    m, why = manifest.verify(storage, folder)
    assert m is None and "__0_0.distcp fails its SHA-256 check" in why
    assert manifest.verify(storage, folder, checksums=False)[0] is not None  # same size


def test_truncated_and_missing_files(storage: Storage) -> None:
    folder = make_ckpt(storage, 10)
    storage.write_atomic(storage.join(folder, "__0_0.distcp"), b"short")
    assert "has 5 bytes, manifest says 1024" in manifest.verify(storage, folder)[1]
    storage.remove(storage.join(folder, "rank-00000.pt"))
    folder2 = make_ckpt(storage, 20)
    storage.remove(storage.join(folder2, "rank-00000.pt"))
    assert manifest.verify(storage, folder2)[1] == "file rank-00000.pt is missing"


@given(st.binary(max_size=200))
def test_garbage_manifest_never_raises(raw: bytes) -> None:
    try:
        manifest.Manifest.from_json(raw)
    except ValueError:
        pass


def test_garbage_manifest_is_reported(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    folder = make_ckpt(storage, 5)
    storage.write_atomic(storage.join(folder, manifest.MANIFEST), b'{"format": "x"}')
    assert manifest.verify(storage, folder) == (None, "not a gpuvigil checkpoint manifest")


def test_candidates_newest_first_and_pruning(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    for step in (10, 20, 30, 40):
        make_ckpt(storage, step)
    make_ckpt(storage, 25, commit=False)  # a crashed save, older than the newest commit
    make_ckpt(storage, 50, commit=False)  # a save still in flight: never pruned
    (tmp_path / "not-a-checkpoint").mkdir()
    assert [s for s, _ in manifest.candidates(storage)] == [50, 40, 30, 25, 20, 10]
    assert [s for s, _ in manifest.committed(storage)] == [40, 30, 20, 10]
    pruned = manifest.to_prune(storage, keep_last=2)
    assert sorted(Path(p).name for p in pruned) == [
        "step-000000010",
        "step-000000020",
        "step-000000025",
    ]


def test_step_dir_names_round_trip() -> None:
    assert manifest.step_of(manifest.dir_name(123)) == 123
    assert manifest.step_of("step-12") is None
