"""The in-memory checkpoint tier on a real 2-rank gloo job (torchrun, CPU): a lost machine
costs at most K steps and resumes bit-identical; a damaged tier falls back to DCP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import EVERY, STEPS, params_equal

K = 2  # memtier.every_steps; DCP saves every EVERY=4 steps
KILL = 11  # start of step 11: 11 steps done, the tier holds step 10, DCP step 8


def _env(job: Any) -> dict[str, str]:
    return {
        "GPUVIGIL__TRAINING__MEMTIER__ENABLED": "true",
        "GPUVIGIL__TRAINING__MEMTIER__EVERY_STEPS": str(K),
        # `{rank}`: each rank is its own "machine" with its own holder folder (its /dev/shm)
        "GPUVIGIL__TRAINING__MEMTIER__DIR": str(job.dir / "shm" / "{rank}"),
    }


def _run(job: Any, baseline: Any, faults: str) -> tuple[Any, dict[str, Any]]:
    """Run the faulty job to its end; it must match the uninterrupted one bit for bit."""
    j = job()
    rc = j.run(faults=faults, env=_env(j))
    assert rc == 0, j.text()[-4000:]
    assert params_equal(j.final, baseline.final)
    restarts = j.event_list("job.restart")
    assert len(restarts) == 1, j.text()[-4000:]
    return j, dict(restarts[0]["data"])


def test_lost_machine_resumes_from_its_peers_copy(job: Any, baseline: Any) -> None:
    j, data = _run(job, baseline, f"killmachine@1:{KILL}")
    assert data["tier"] == "memory", data
    assert KILL - data["resumed_step"] <= K and data["resumed_step"] == 10
    assert "rank 1 restored step 10 from its peer rank 0" in j.text()
    # the peer copy exists: rank 0's node holds rank 1's copy (and rank 1 its own again)
    assert (j.dir / "shm" / "0" / f"peer-r00001-s{STEPS:09d}.bin").exists()
    assert (j.dir / "shm" / "1" / f"own-r00001-s{STEPS:09d}.bin").exists()


def test_damaged_memory_tier_falls_back_to_dcp(job: Any, baseline: Any) -> None:
    j, data = _run(job, baseline, f"damagemem@0:{KILL},killmachine@1:{KILL}")
    assert data["tier"] == "persistent", data
    assert "in-memory tier not used" in data["tier_note"]
    # the newest committed DCP step: 8, or 4 when step 8's async save was still in flight
    assert data["resumed_step"] in (4, (KILL // EVERY) * EVERY), data
    assert "falling back to the persistent tier" in j.text()
    assert "DAMAGED (SHA-256 mismatch)" in j.text()


def test_memtier_blob_roundtrip_and_damage(tmp_path: Path) -> None:
    import pytest
    import torch

    from gpuvigil.training import memtier

    flat = {"w": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "e": torch.empty(0)}
    blob = memtier.pack(3, flat, {"rank": 0, "world_size": 1, "x": (1, 2)})
    header, back = memtier.unpack(blob)
    assert header["step"] == 3 and header["x"] == (1, 2)
    assert torch.equal(back["w"], flat["w"]) and back["e"].shape == (0,)
    blob[len(blob) // 2] ^= 1
    with pytest.raises(memtier.Damaged, match="SHA-256"):
        memtier.unpack(blob)
