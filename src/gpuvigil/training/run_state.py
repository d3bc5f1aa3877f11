"""What a `Run` checkpoints beside its tensors, and how a resume puts everything back.

Called by `run.Run`. Tensors: the model and optimizer state of every model part, merged
(parameter names are unique across a rank's parts) with the optimizer state flattened by
parameter name, as torchtitan does. Per rank (`rank-R.json`): RNG states, LR schedulers,
`run.extra`. The job's (`global.json`, rank 0): data position, `run.extra_global`, the save
time and recent step times (a resumed attempt's hang timeout derives from them at once).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from gpuvigil.training import resume, rng

if TYPE_CHECKING:
    from gpuvigil.training.run import Run

log = logging.getLogger("gpuvigil.training")

_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
# Several parts: each part takes its own keys from the merged state and ignores the others'.
_FLAT_PARTS = StateDictOptions(flatten_optimizer_state_dict=True, strict=False)


def tensors(run: Run) -> dict[str, Any]:
    model_sd: dict[str, Any] = {}
    optim_sd: dict[str, Any] = {}
    for m, o in zip(run.models, run.optimizers, strict=True):
        msd, osd = get_state_dict(m, o, options=_FLAT)
        model_sd.update(msd)
        optim_sd.update(osd)
    return {"model": model_sd, "optim": optim_sd}


def rank_state(run: Run) -> dict[str, Any]:
    return {
        "rng": rng.capture(),
        "scheduler": [s.state_dict() for s in run.schedulers],
        "extra": run.extra,
    }


def job_state(run: Run, *, step_times: list[float]) -> dict[str, Any]:
    return {
        "sampler": run.sampler.state_dict() if run.sampler is not None else None,
        "extra": run.extra_global,
        "saved_ts": time.time(),
        "step_times": step_times[-100:],
    }


def restore(run: Run, loaded: resume.Loaded) -> None:
    """Put a verified, loaded checkpoint back into the run's objects."""
    options = _FLAT if len(run.models) == 1 else _FLAT_PARTS
    for m, o in zip(run.models, run.optimizers, strict=True):
        set_state_dict(
            m,
            o,
            model_state_dict=loaded.tensors["model"],
            optim_state_dict=loaded.tensors["optim"],
            options=options,
        )
    mine = loaded.own or loaded.main
    for sched, state in zip(run.schedulers, mine.get("scheduler") or [], strict=False):
        sched.load_state_dict(state)
    if run.sampler is not None and loaded.job.get("sampler") is not None:
        run.sampler.load_state_dict(loaded.job["sampler"])
    run.extra_global.update(loaded.job.get("extra") or {})
    if loaded.own is not None:
        run.extra.update(loaded.own.get("extra") or {})
        rng.restore(loaded.own["rng"])
    else:  # resized: per-rank state cannot be mapped onto other ranks
        rng.reseed(run.config.seed, step=loaded.step, rank=run.env.rank)
        log.info(
            "gpuvigil checkpoint: world size changed (%s -> %d): RNG reseeded per rank; "
            "per-rank run.extra not restored (run.extra_global is)",
            loaded.main.get("world_size"),
            run.env.world_size,
        )


def load(run: Run) -> resume.Loaded | None:
    """Choose (every file verified, each rank its share), load and restore the newest
    intact checkpoint into `run`; None when there is none."""
    ckpt, env = run._ckpt, run.env
    assert ckpt is not None
    group = env.groups["checkpoint"]
    choice = resume.choose(
        ckpt.storage,
        rank=env.rank,
        world_size=env.world_size,
        group=group,
        checksums=run.config.checkpoint.checksums,
    )
    for s in choice.skipped:
        run.metrics.checkpoint_fallbacks.labels(reason=s.reason).inc()
        if env.rank == 0:
            log.warning(resume.describe(s))
    run.metrics.checkpoint_verified_bytes.inc(choice.verified_bytes)
    # Every rank has the same choice (the verdicts were gathered): all refuse, or none.
    refused = resume.refusal(choice, location=ckpt.storage.location)
    if refused and not run.config.checkpoint.allow_fresh_start:
        if env.rank == 0:
            log.error(refused)
        raise resume.NoVerifiedCheckpoint(refused)
    if env.rank == 0:
        if refused:
            log.warning(
                "gpuvigil checkpoint: no checkpoint verifies; starting again at step 0 as "
                "checkpoint.allow_fresh_start asks"
            )
        resume.keep_damaged(ckpt.storage, choice.skipped)
    if choice.folder is None:
        return None
    loaded = resume.load(
        ckpt.storage,
        choice.folder,
        tensors(run),
        rank=env.rank,
        world_size=env.world_size,
        group=group,
    )
    restore(run, loaded)
    return loaded
