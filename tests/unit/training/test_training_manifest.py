"""Manifest and storage: commit record, verification, fallback order, pruning, who verifies
what, and paths that stay inside the checkpoint folder (relative roots included)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.training import manifest
from gpuvigil.training.storage import FsspecStorage, LocalStorage, Storage
from gpuvigil.training.writer import write_file

FILES = {
    ".metadata": b"meta" * 10,
    "__0_0.distcp": bytes(range(256)) * 4,
    "__1_0.distcp": bytes(range(256)) * 2,
    "rank-00000.json": b"{}",
    "rank-00001.json": b"{}",
    "global.json": b"{}",
}


def make_ckpt(storage: Storage, step: int, *, commit: bool = True) -> str:
    folder = manifest.dir_name(step)
    digests = {n: write_file(storage, f"{folder}/{n}", [memoryview(b)]) for n, b in FILES.items()}
    if commit:
        m = manifest.build(step=step, world_size=2, files=digests, created_ts=1.0)
        storage.write_atomic(f"{folder}/{manifest.MANIFEST}", m.to_json())
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
    assert m.step == 10 and set(m.files) == set(FILES)
    assert all(len(e["sha256"]) == 64 for e in m.files.values())


def test_uncommitted_is_not_loadable(storage: Storage) -> None:
    folder = make_ckpt(storage, 10, commit=False)
    assert manifest.verify(storage, folder) == (None, "no manifest (the save never committed)")


def test_flipped_byte_is_caught_by_checksum(storage: Storage) -> None:
    folder = make_ckpt(storage, 10)
    rel = f"{folder}/__0_0.distcp"
    data = bytearray(storage.read_bytes(rel))
    data[100] ^= 0xFF
    storage.write_atomic(rel, bytes(data))
    m, why = manifest.verify(storage, folder)
    assert m is None and "__0_0.distcp fails its SHA-256 check" in why
    assert manifest.verify(storage, folder, checksums=False)[0] is not None  # same size


def test_truncated_and_missing_files(storage: Storage) -> None:
    folder = make_ckpt(storage, 10)
    storage.write_atomic(f"{folder}/__0_0.distcp", b"short")
    assert "has 5 bytes, manifest says 1024" in manifest.verify(storage, folder)[1]
    folder2 = make_ckpt(storage, 20)
    storage.remove(f"{folder2}/rank-00000.json")
    assert manifest.verify(storage, folder2)[1] == "file rank-00000.json is missing"


@given(st.binary(max_size=200))
def test_garbage_manifest_never_raises(raw: bytes) -> None:
    try:
        manifest.Manifest.from_json(raw)
    except ValueError:
        pass


def test_garbage_manifest_is_reported(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    folder = make_ckpt(storage, 5)
    storage.write_atomic(f"{folder}/{manifest.MANIFEST}", b'{"format": "x"}')
    assert manifest.verify(storage, folder) == (None, "not a gpuvigil checkpoint manifest")


def test_a_manifest_cannot_name_files_outside_the_checkpoint(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path / "ckpt"))
    folder = make_ckpt(storage, 5)
    m = manifest.build(
        step=5,
        world_size=1,
        created_ts=1.0,
        files={".metadata": {"size": 1, "sha256": None}, "../../etc/passwd": {"size": 1}},
    )
    storage.write_atomic(f"{folder}/{manifest.MANIFEST}", m.to_json())
    got, why = manifest.read(storage, folder)
    assert got is None and "outside the checkpoint" in why


def test_candidates_newest_first_and_pruning(tmp_path: Path) -> None:
    storage = LocalStorage(str(tmp_path))
    for step in (10, 20, 30, 40):
        make_ckpt(storage, step)
    make_ckpt(storage, 25, commit=False)  # a crashed save, older than the newest commit
    make_ckpt(storage, 50, commit=False)  # a save still in flight: never pruned
    (tmp_path / "not-a-checkpoint").mkdir()
    assert [s for s, _ in manifest.candidates(storage)] == [50, 40, 30, 25, 20, 10]
    assert [s for s, _ in manifest.committed(storage)] == [40, 30, 20, 10]
    assert manifest.to_prune(storage, keep_last=2) == [
        "step-000000010",
        "step-000000020",
        "step-000000025",
    ]


def test_a_relative_root_is_one_folder_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bug of issue #15: `ckpt` became `ckpt/ckpt/step-N` for the rank files."""
    monkeypatch.chdir(tmp_path)
    storage = LocalStorage("ckpt")
    folder = make_ckpt(storage, 10)
    assert (tmp_path / "ckpt" / folder / manifest.MANIFEST).exists()
    assert not (tmp_path / "ckpt" / "ckpt").exists()
    os.chdir("/")  # a process that changes directory keeps the same folder
    assert manifest.verify(storage, folder)[0] is not None


def test_each_rank_verifies_its_own_files_and_shares_the_rest() -> None:
    files = {n: {"size": len(b)} for n, b in FILES.items()}
    files["__2_0.distcp"] = {"size": 4096}  # a rank gone after a resize to 2
    shares = manifest.assign(files, world_size=2)
    assert "__0_0.distcp" in shares[0] and "rank-00000.json" in shares[0]
    assert "__1_0.distcp" in shares[1] and "rank-00001.json" in shares[1]
    assert sorted(itertools.chain(*shares)) == sorted(files)  # every file, exactly once
    assert "__2_0.distcp" in shares[1]  # the lighter rank takes the orphan


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=40), st.integers(1, 16))
def test_shares_are_balanced(sizes: list[int], world: int) -> None:
    files = {f"__{i}_0.distcp": {"size": s} for i, s in enumerate(sizes)}
    shares = manifest.assign(files, world_size=world)
    assert sorted(itertools.chain(*shares)) == sorted(files)
    own = [[n for n in files if manifest.owner(n, world_size=world) == r] for r in range(world)]
    for r in range(world):
        assert set(own[r]) <= set(shares[r])


def test_step_dir_names_round_trip() -> None:
    assert manifest.step_of(manifest.dir_name(123)) == 123
    assert manifest.step_of("step-12") is None
