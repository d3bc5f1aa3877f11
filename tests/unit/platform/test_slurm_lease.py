"""The Slurm controllers' lease files: a compare-and-swap register in a shared folder. Real
files, several writers in real processes; the election over it with two controllers on real
Slurm: tests/integration/controller/test_split_brain.py."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from gpuvigil.platform.clusters.base import Conflict
from gpuvigil.platform.clusters.slurm_lease import KEEP, FileLease
from gpuvigil.platform.leader import LeaderElector


def test_versions_are_compare_and_swap(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path / "lease"), FileLease(tmp_path / "lease")
    assert a.get() is None
    first = a.create({"holderIdentity": "a"}, {})
    with pytest.raises(Conflict):
        b.create({"holderIdentity": "b"}, {})
    seen = b.get()
    assert seen == first
    a.replace({"holderIdentity": "a", "n": 1}, {"k": "v"}, version=first.version)
    with pytest.raises(Conflict):  # b read version 1, which is no longer the latest
        b.replace({"holderIdentity": "b"}, {}, version=seen.version)
    now = b.get()
    assert now is not None and now.spec["n"] == 1 and now.annotations == {"k": "v"}
    assert oct((tmp_path / "lease").stat().st_mode & 0o777) == "0o700"


def test_a_reader_too_far_behind_gets_a_conflict_not_a_pruned_name(tmp_path: Path) -> None:
    a, b = FileLease(tmp_path), FileLease(tmp_path)
    old = a.create({"holderIdentity": "a"}, {})
    cur = old
    for _ in range(KEEP + 100):
        cur = a.replace({"holderIdentity": "a"}, {}, version=cur.version)
    assert not (tmp_path / f"lease.{int(old.version) + 1:012d}.json").exists()  # pruned
    with pytest.raises(Conflict):
        b.replace({"holderIdentity": "b"}, {}, version=old.version)
    assert len(list(tmp_path.glob("lease.*.json"))) <= KEEP + 100


def test_garbage_reads_as_an_unknown_holder(tmp_path: Path) -> None:
    (tmp_path / f"lease.{1:012d}.json").write_text("{not json")
    lease = FileLease(tmp_path).get()
    assert lease is not None and lease.spec["holderIdentity"] == "(unreadable)"
    assert lease.version == "1"


def _race(folder: str, who: str, rounds: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    lease, wins = FileLease(folder), 0
    for _ in range(rounds):
        cur = lease.get()
        try:
            if cur is None:
                lease.create({"holderIdentity": who}, {})
            else:
                lease.replace({"holderIdentity": who}, {}, version=cur.version)
            wins += 1
        except Conflict:
            pass
    out.put((who, wins))


def test_concurrent_writers_in_processes_never_write_the_same_version(tmp_path: Path) -> None:
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_race, args=(str(tmp_path), w, 150, out)) for w in "abc"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    wins = dict(out.get(timeout=5) for _ in procs)
    newest = max(int(p.name.split(".")[1]) for p in tmp_path.glob("lease.*.json"))
    assert sum(wins.values()) == newest  # every successful write made exactly one version
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp.")]


def test_election_over_lease_files(tmp_path: Path) -> None:
    t = [0.0]
    a = LeaderElector(FileLease(tmp_path), identity="a", monotonic=lambda: t[0])
    b = LeaderElector(FileLease(tmp_path), identity="b", monotonic=lambda: t[0])
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    t[0] += 15
    assert b.try_acquire_or_renew() and not a.is_leader()
    b.update(lambda ann: {**ann, "gpuvigil.io/budget": '{"v":1,"slots":{}}'})
    assert FileLease(tmp_path).get().annotations  # type: ignore[union-attr]
