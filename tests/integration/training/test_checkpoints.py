"""Checkpoints on real torchrun: failed saves end the job with their code, four ranks verify
a checkpoint in parallel (each its own files), and a planted pickle never runs."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.training import manifest

from .conftest import Job, params_equal

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(300)]


def test_failed_saves_end_the_job_with_checkpoint_failed(job: Any) -> None:
    """Every save from step 8 on fails (the disk is full). Two failures in a row are
    allowed; the next save point ends the job with exit code 90 on every rank, and the
    launcher exits with it (torchrun alone would say 1)."""
    j: Job = job()
    rc = j.run(
        faults="failsave@*:8:*",
        max_restarts=0,
        env={"GPUVIGIL__TRAINING__CHECKPOINT__MAX_CONSECUTIVE_FAILURES": "2"},
    )
    assert rc == exit_codes.CHECKPOINT_FAILED, j.text()[-4000:]
    log = j.text()
    for rank in (0, 1):  # every rank knows; no rank says "saved" for a failed save
        assert f"rank{rank} gpuvigil checkpoint: save of step 8 FAILED on every rank" in log
        assert f"rank{rank} gpuvigil checkpoint: step 8 saved" not in log
    assert "2 saves in a row failed (the last, of step 12" in log
    saves = {e["data"]["step"]: e["data"] for e in j.event_list("checkpoint")}
    assert saves[4]["result"] == "ok"
    assert saves[8]["result"] == saves[12]["result"] == "failed"
    assert "No space left on device" in saves[8]["error"]
    assert (saves[8]["consecutive_failures"], saves[12]["consecutive_failures"]) == (1, 2)
    assert 16 not in saves  # the job ended at that save point
    assert [s for s, _ in manifest.committed(j.storage())] == [4]
    (end,) = j.event_list("job.end")
    assert end["data"]["result"] == "failed"
    assert end["data"]["exit_code"] == exit_codes.CHECKPOINT_FAILED


def _verified(log: str) -> dict[int, tuple[int, int, list[str]]]:
    """rank -> (files, bytes) it verified, from its log line."""
    out = {}
    for m in re.finditer(
        r"rank(\d) gpuvigil checkpoint: rank \d verified (\d+) of (\d+) files of (\S+) "
        r"\((\d+) bytes",
        log,
    ):
        out[int(m.group(1))] = (int(m.group(2)), int(m.group(5)), [m.group(4)])
    return out


def test_four_ranks_verify_in_parallel_and_the_owner_of_a_damaged_file_names_it(
    job: Any,
) -> None:
    j: Job = job()
    assert j.run(nproc=4, steps=8, every=4) == 0, j.text()[-4000:]
    newest = j.ckpt / manifest.dir_name(8)
    table = json.loads((newest / manifest.MANIFEST).read_text())["files"]
    total = sum(e["size"] for e in table.values())
    # Flip one byte of rank 2's tensor file: same size, so only its checksum tells.
    data = newest / "__2_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))

    resumed = job(f"{j.dir.name}-resume")
    assert resumed.run(nproc=4, steps=12, every=4, ckpt=j.ckpt) == 0, resumed.text()[-4000:]
    log = resumed.text()
    assert (
        "gpuvigil checkpoint: step-000000008 is DAMAGED (file __2_0.distcp fails its SHA-256 check"
    ) in log
    assert f"resumed from {j.ckpt / manifest.dir_name(4)} (step 4, saved by 4 ranks, now 4)" in log
    shares = _verified(log)  # of step 4, the one that loaded
    assert sorted(shares) == [0, 1, 2, 3], log[-3000:]
    assert sum(f for f, _, _ in shares.values()) == len(table)  # every file, once
    for rank, (_files, nbytes, _) in shares.items():
        assert nbytes < total * 0.6, (rank, nbytes, total)  # a share, never the whole
    ckpt4 = json.loads((j.ckpt / manifest.dir_name(4) / manifest.MANIFEST).read_text())["files"]
    own0 = ckpt4["__0_0.distcp"]["size"] + ckpt4["rank-00000.json"]["size"]
    assert shares[0][1] <= own0 + ckpt4[".metadata"]["size"] + ckpt4["global.json"]["size"]
    fallbacks = [e for e in resumed.event_list("job.restart")]
    assert fallbacks and fallbacks[0]["data"]["resumed_step"] == 4


class _Payload:
    """What an attacker who can write the checkpoint store plants: code in a pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_never_runs(baseline: Job, job: Any, tmp_path: Path) -> None:
    """The attacker replaces the newest checkpoint's DCP metadata and rank 0's state with
    pickles and rewrites the (unsigned) manifest so every checksum matches. Loading never
    unpickles: both files are refused as "not gpuvigil data", the job falls back to the
    previous checkpoint, finishes bit-identical, and the payload never ran."""
    marker = tmp_path / "pwned"
    j: Job = job()
    shutil.copytree(baseline.ckpt, j.ckpt)  # checkpoints 16, 20, 24
    newest = j.ckpt / manifest.dir_name(24)
    evil = pickle.dumps(_Payload(marker))
    for name in (".metadata", "rank-00000.json"):
        (newest / name).write_bytes(evil)
    m = json.loads((newest / manifest.MANIFEST).read_text())
    for name in (".metadata", "rank-00000.json"):
        m["files"][name] = {"size": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}
    (newest / manifest.MANIFEST).write_text(json.dumps(m))
    assert pickle.loads(evil) == 0 and marker.exists()  # the payload is live...
    marker.unlink()

    assert j.run() == 0, j.text()[-4000:]
    assert not marker.exists()  # ...and loading the checkpoint never ran it
    log = j.text()
    assert "step-000000024 is DAMAGED (file " in log and "is not gpuvigil data" in log
    assert "resumed from " + str(j.ckpt / manifest.dir_name(20)) in log
    assert params_equal(j.final, baseline.final)


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def test_every_checkpoint_damaged_exits_91_keeps_them_and_fresh_start_is_explicit(
    job: Any,
) -> None:
    """Both checkpoints of a 2-rank job are damaged (a flipped byte in rank 1's tensors of
    one, a truncated manifest of the other). The next run exits 91 with an ERROR naming
    each, without a torchrun restart, and deletes nothing. Only --allow-fresh-start
    starts again at step 0, and even then the damaged folders are kept, set aside."""
    j: Job = job()
    assert j.run(steps=8, every=4) == 0, j.text()[-4000:]
    s4, s8 = (j.ckpt / manifest.dir_name(n) for n in (4, 8))
    raw = bytearray((s4 / "__1_0.distcp").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (s4 / "__1_0.distcp").write_bytes(bytes(raw))
    m8 = (s8 / manifest.MANIFEST).read_bytes()
    (s8 / manifest.MANIFEST).write_bytes(m8[: len(m8) // 2])
    before = {f.name: _digests(f) for f in (s4, s8)}

    refused = job(f"{j.dir.name}-refused")
    rc = refused.run(steps=8, every=4, ckpt=j.ckpt, max_restarts=3)
    log = refused.text()
    assert rc == exit_codes.NO_VERIFIED_CHECKPOINT, log[-4000:]
    (line,) = {x.split("rank0 ", 1)[-1] for x in log.splitlines() if "none can be verified" in x}
    assert "2 checkpoint(s) in" in line and "refusing to start again at step 0" in line
    assert "step-000000008: manifest is not JSON" in line
    assert "step-000000004: file __1_0.distcp fails its SHA-256 check" in line
    # No restart: every retry would read the same folders.
    assert log.count("gpuvigil launch: starting the workers") == 1
    assert "not restarting (3 restarts left unused)" in log
    assert {f.name: _digests(f) for f in (s4, s8)} == before  # nothing deleted or changed
    assert sorted(p.name for p in j.ckpt.iterdir() if p.name.startswith("step-")) == [
        s4.name,
        s8.name,
    ]
    assert not refused.event_list("job.start") and not refused.event_list("checkpoint")
    (end,) = refused.event_list("job.end")
    assert (end["data"]["result"], end["data"]["exit_code"]) == ("failed", 91)

    fresh = job(f"{j.dir.name}-fresh")
    rc = fresh.run(steps=8, every=4, ckpt=j.ckpt, launch=("--allow-fresh-start",))
    log = fresh.text()
    assert rc == 0, log[-4000:]
    assert "starting again at step 0 as checkpoint.allow_fresh_start asks" in log
    for f in (s4, s8):  # set aside, byte for byte, and out of reach of pruning
        assert _digests(j.ckpt / f"damaged-{f.name}") == before[f.name]
    assert [s for s, _ in manifest.committed(j.storage())] == [8, 4]  # the fresh run's own
