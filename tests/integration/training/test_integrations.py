"""The loops people already use, on real torchrun: pipeline parallelism with several model
parts per rank (torchtitan style), HF Accelerate with gradient accumulation, and a
PyTorch Lightning callback. Each example in examples/ runs unchanged."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
from typing import Any

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.training import manifest
from testkit import require

from .conftest import ROOT, Job, params_equal, wait_for

pytestmark = [pytest.mark.realparts, pytest.mark.timeout(400)]

PIPELINE = ROOT / "examples" / "train_pipeline.py"
ACCELERATE = ROOT / "examples" / "train_accelerate.py"
LIGHTNING = ROOT / "examples" / "train_lightning.py"
PLAIN_LOADER = ROOT / "tests" / "integration" / "training" / "lightning_plain_loader.py"


def _state(j: Job, step: int, name: str) -> dict[str, Any]:
    return dict(json.loads((j.ckpt / manifest.dir_name(step) / name).read_text()))


def test_pipeline_parts_resume_bit_identical_with_per_rank_state(job: Any) -> None:
    """Two ranks, four stages, two model parts per rank (interleaved 1F1B). A rank killed
    mid-run: both ranks resume their own parts, the result matches an uninterrupted run,
    and each rank's `run.extra` comes back on that rank (rank 1, the last stage, counted
    the losses; rank 0 has none: before, every rank got rank 0's extra)."""
    clean: Job = job("pp-clean")
    assert clean.run(script=PIPELINE, steps=16, every=4, final="final-{rank}.pt") == 0, (
        clean.text()[-3000:]
    )
    hit: Job = job("pp-killed")
    rc = hit.run(script=PIPELINE, steps=16, every=4, faults="kill@1:10", final="final-{rank}.pt")
    assert rc == 0, hit.text()[-3000:]
    assert hit.attempts() == {0, 1} and "resumed from" in hit.text()
    for rank in (0, 1):
        assert params_equal(hit.dir / f"final-{rank}.pt", clean.dir / f"final-{rank}.pt")
    assert _state(hit, 16, "rank-00001.json")["extra"] == {"losses": 16 * 4}
    assert _state(hit, 16, "rank-00000.json")["extra"] == {"losses": 0}
    parts = {n for n in _state(hit, 16, "rank-00000.json")["skeleton"]["model"]}
    assert parts == {"layers.0.0.weight", "layers.0.0.bias", "layers.2.0.weight", "layers.2.0.bias"}


def test_accelerate_with_gradient_accumulation_resumes_exactly(job: Any) -> None:
    require(
        importlib.util.find_spec("accelerate") is not None, "accelerate (gpuvigil[integrations])"
    )
    clean: Job = job("acc-clean")
    assert clean.run(script=ACCELERATE, steps=12, every=4, extra=["--accumulate", "4"]) == 0
    hit: Job = job("acc-killed")
    rc = hit.run(
        script=ACCELERATE, steps=12, every=4, extra=["--accumulate", "4"], faults="kill@0:6"
    )
    assert rc == 0, hit.text()[-3000:]
    assert hit.attempts() == {0, 1}
    assert params_equal(hit.final, clean.final)
    job_state = _state(hit, 12, "global.json")
    # 12 optimizer steps x 4 micro-batches x 8 samples x 2 ranks: counted once, not twice.
    assert job_state["sampler"]["consumed"] == 12 * 4 * 8 * 2 and job_state["step"] == 12


def test_lightning_callback_drains_on_sigterm_and_resumes_at_that_step(job: Any) -> None:
    """SIGTERM to the launcher as training starts: torchrun forwards it to both ranks, which
    get it wherever each is (often in different batches, or one in a collective). Before,
    Lightning's own handling could deadlock them there; every rank now stops after the same
    step, saves it and exits 89, and the next run resumes at that step."""
    require(
        importlib.util.find_spec("pytorch_lightning") is not None,
        "pytorch-lightning (gpuvigil[integrations])",
    )
    j: Job = job("pl")
    j.start(script=LIGHTNING, steps=100_000, every=10_000, final=None)
    wait_for(
        lambda: "gpuvigil: training starts at step 0" in j.text(), timeout=240, what="Lightning"
    )
    assert j.proc is not None
    j.proc.send_signal(signal.SIGTERM)
    assert j.wait(timeout=120) == exit_codes.DRAINED, j.text()[-4000:]
    stops = {int(s) for s in re.findall(r"gpuvigil drain: stopped after step (\d+) with", j.text())}
    assert len(stops) == 1, j.text()[-3000:]
    stop = stops.pop()
    assert (j.ckpt / "last.ckpt").exists()

    again: Job = job("pl-again")
    assert (
        again.run(
            script=LIGHTNING,
            steps=stop + 20,
            every=10_000,
            final=None,
            ckpt=j.ckpt,
            env={"GPUVIGIL_JOB_ID": j.dir.name},
        )
        == 0
    ), again.text()[-3000:]
    assert f"gpuvigil: training starts at step {stop}" in again.text()  # nothing lost
    (restart,) = again.event_list("job.restart")
    assert restart["data"]["cause"] == "drain" and restart["data"]["lost_steps"] == 0
    assert again.event_list("job.end")[0]["data"]["steps"] == stop + 20


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param("term@1:0", id="first-batch"),
        pytest.param("term@1:-1", id="before-first-batch"),  # Lightning's handlers in place
    ],
)
def test_lightning_drain_agrees_when_one_rank_alone_gets_sigterm(job: Any, fault: str) -> None:
    """Rank 1 alone SIGTERMs itself (a node's agent signals only its own workers; here at a
    chosen point, not a racing one): as its first batch starts, or as training starts, when
    Lightning's signal handlers are registered and rank 0 waits in the callback's all-gather.
    Lightning's own handler ran a broadcast inside the signal handler, on rank 1 alone, and
    the job deadlocked; the callback's drain spreads the flag with its all-reduce, so both
    ranks stop after the same step, save it and exit 89."""
    require(
        importlib.util.find_spec("pytorch_lightning") is not None,
        "pytorch-lightning (gpuvigil[integrations])",
    )
    j: Job = job()
    rc = j.run(
        script=LIGHTNING,
        steps=100_000,
        every=10_000,
        final=None,
        faults=fault,
        max_restarts=0,  # the launcher got no signal: it would restart the drained group
    )
    assert rc == exit_codes.DRAINED, j.text()[-4000:]
    stops = re.findall(r"rank(\d) gpuvigil drain: stopped after step (\d+) with", j.text())
    assert sorted(r for r, _ in stops) == ["0", "1"], j.text()[-3000:]
    assert len({s for _, s in stops}) == 1, stops
    assert (j.ckpt / "last.ckpt").exists()
    assert "SIGTERM to this worker alone" in j.text()


def test_a_loader_lightning_cannot_resume_ends_the_job_at_once_with_92(job: Any) -> None:
    """The Lightning example with a plain DataLoader: every rank refuses before its first
    step and exits 92 (NOT_RESUMABLE). The real launcher ends the job at once with 92, its
    3 restarts unspent (a retry builds the same loader), and writes job.end failed with it."""
    require(
        importlib.util.find_spec("pytorch_lightning") is not None,
        "pytorch-lightning (gpuvigil[integrations])",
    )
    j: Job = job()
    rc = j.run(script=PLAIN_LOADER, steps=20, every=10, final=None, max_restarts=3, timeout=60)
    log = j.text()
    assert rc == exit_codes.NOT_RESUMABLE, log[-4000:]
    for rank in (0, 1):
        assert f"rank{rank} gpuvigil: refusing to train: train dataloader 0 (DataLoader)" in log
    assert log.count("gpuvigil launch: starting the workers") == 1
    assert "not restarting (3 restarts left unused)" in log
    assert j.attempts() == {0}
    assert "gpuvigil launch: torchrun gave up; exiting with 92 (NOT_RESUMABLE" in log
    assert not j.event_list("job.start") and not j.event_list("job.restart")
    (end,) = j.event_list("job.end")
    assert (end["data"]["result"], end["data"]["exit_code"]) == ("failed", 92)
    assert end["data"]["cause"] == "user_code"  # the loader is the script's, not the node's
    assert not (j.ckpt / "last.ckpt").exists()  # refused before anything trained


def test_fsdp2_state_reuses_its_staging_buffers_and_reshards_on_resume(job: Any) -> None:
    """FSDP2 shards parameters and optimizer state as DTensors. Three async saves stage them
    into one arena (no fresh copies per save), and a 1-rank job resumes the 2-rank
    checkpoint, resharded by DCP."""
    script = ROOT / "tests" / "integration" / "training" / "fsdp2_job.py"
    j: Job = job("fsdp2")
    assert j.run(script=script, steps=6, every=2) == 0, j.text()[-3000:]
    # every rank's arena holds one layout however many saves it staged (a launcher restart
    # would log the line again per attempt: the rank set and the count are what matter)
    staged = re.findall(r"rank(\d) staging: (\d+) layout\(s\) for (\w+) state", j.text())
    assert {r for r, _, _ in staged} == {"0", "1"}, j.text()[-3000:]
    assert {(n, kind) for _, n, kind in staged} == {("1", "DTensor")}, staged
    one: Job = job("fsdp2-1rank")
    assert one.run(script=script, nproc=1, steps=8, every=2, ckpt=j.ckpt) == 0, one.text()[-3000:]
    assert "(step 6, saved by 2 ranks, now 1)" in one.text()
