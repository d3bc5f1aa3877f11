"""gpuvigil for PyTorch Lightning: one callback (`pip install 'gpuvigil[integrations]'`).

    from gpuvigil.training.lightning import Resilience
    trainer = Trainer(..., callbacks=[Resilience(), ModelCheckpoint(dirpath=..., save_last=True)])
    trainer.fit(model, ckpt_path="last")   # resumes from the drain's (or the last) checkpoint

Lightning owns the loop, the process group and the checkpoint format; the callback brings
what Lightning lacks, from the same parts `training.Run` uses:
- the health gate (exit 87/88 on a node the agent marks unhealthy);
- the hang watchdog and the heartbeat that `python -m gpuvigil.training.launch`'s monitor
  reads (a frozen rank named and the group restarted within the timeout plus 5 s);
- straggler detection on busy time (DDP);
- a drain: on SIGTERM every rank stops after the same optimizer step, writes `last.ckpt`
  with `trainer.save_checkpoint` and ends with exit code 89 (`drain.Drain`, as in
  `training.Run`; Lightning's own SIGTERM handling is replaced, see `_take_sigterm`);
- the job's events (job.start/restart/end, hang, straggler) and exit records;
- exact resume: training refuses to start on a train loader whose position Lightning cannot
  restore (`not_resumable`), where a resume in the middle of an epoch would read that epoch
  again and end with other weights; `loader.ResumableLoader` is one it can, and the callback
  moves its position at each batch end (`allow_inexact_resume=True` accepts the difference).
Lightning's checkpoints are Lightning's (a pickle it loads itself); `training.Run`'s own
checkpoints are the ones that never unpickle.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch.distributed as dist
from prometheus_client import CollectorRegistry

from gpuvigil.core import exit_codes
from gpuvigil.core.findings import utcnow
from gpuvigil.training import (
    checkpoint,
    drain,
    health_gate,
    heartbeat,
    identity,
    metrics,
    process_group,
    watchdog,
)
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.journal import Journal
from gpuvigil.training.loader import ResumableLoader
from gpuvigil.training.process_group import Env
from gpuvigil.training.storage import open_storage
from gpuvigil.training.straggler_watch import StragglerWatch

try:  # the unified package first, then the standalone one
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError:
    from pytorch_lightning import Callback
    from pytorch_lightning.callbacks import ModelCheckpoint

log = logging.getLogger("gpuvigil.training")


class NotResumable(SystemExit):
    """A train loader whose mid-epoch position a resume would not restore: the rank exits
    with NOT_RESUMABLE (92), which the launcher and a Job's podFailurePolicy end the job on
    at once (a retry builds the same loader), never a restart charged as a crash."""

    def __init__(self, message: str) -> None:
        log.error("%s", message)
        super().__init__(exit_codes.NOT_RESUMABLE)
        self.message = message

    def __str__(self) -> str:
        return self.message


def not_resumable(
    loaders: Sequence[object], *, rank: int, world_size: int, batches_done: int = 0
) -> list[str]:
    """Why a resume in the middle of an epoch would not continue where training stopped: one
    reason per train loader that Lightning cannot restore, or restores inconsistently (empty:
    it resumes exactly). `batches_done`: Lightning's count of the batches of the epoch it
    restored, which a ResumableLoader's restored position must match."""
    reasons = []
    for i, dl in enumerate(loaders):
        name = f"train dataloader {i} ({type(dl).__name__})"
        if isinstance(dl, ResumableLoader):
            s = dl.resumable
            if (s.rank, s.world_size) != (rank, world_size):
                reasons.append(
                    f"{name}: its ResumableSampler is rank {s.rank} of {s.world_size}, but this"
                    f" is rank {rank} of {world_size}"
                )
            elif dl.position != batches_done:
                reasons.append(
                    f"{name}: the checkpoint puts it {dl.position} batches into its epoch but"
                    f" Lightning {batches_done} (a checkpoint from another loader or world size)"
                )
        elif not (
            callable(getattr(dl, "state_dict", None))
            and callable(getattr(dl, "load_state_dict", None))
        ):
            sampler = getattr(dl, "sampler", None)
            why = (
                f"; its {type(sampler).__name__}'s state is not one Lightning saves"
                if callable(getattr(sampler, "state_dict", None))
                else ""
            )
            reasons.append(
                f"{name} has no state_dict/load_state_dict: Lightning cannot restore its"
                f" position, so a resume in the middle of an epoch reads the epoch again{why}"
            )
    return reasons


class Resilience(Callback):  # type: ignore[misc]
    def __init__(
        self, config: TrainingConfig | None = None, *, allow_inexact_resume: bool = False
    ) -> None:
        """`allow_inexact_resume`: train on a loader that `not_resumable` refuses (a resume in
        the middle of an epoch then ends with other weights than an uninterrupted run)."""
        self.config = config or TrainingConfig.load()
        self.allow_inexact_resume = allow_inexact_resume
        self.env: Env | None = None
        self.journal: Journal | None = None
        self.metrics = metrics.build(CollectorRegistry())
        self._watchdog: watchdog.Watchdog | None = None
        self._hb: heartbeat.HeartbeatWriter | None = None
        self._stragglers: StragglerWatch | None = None
        self._drain: drain.Drain | None = None
        self._batches = 0
        self._t0 = 0.0
        self._step = -1  # the trainer's global_step at the last batch end
        self._step_s = 0.0  # time in the batches of the optimizer step under way

    # --- what StragglerWatch reads from its owner (the same fields as training.Run) ----------
    @property
    def models(self) -> list[Any]:
        return self._models

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        cfg = self.config
        verdict = health_gate.check(cfg.health_gate, now=utcnow())
        if not verdict.allowed:
            log.error("%s (exit code %d)", verdict.message, verdict.exit_code)
            raise health_gate.NodeRefused(verdict)
        many = dist.is_available() and dist.is_initialized() and trainer.world_size > 1
        self.env = Env(
            rank=trainer.global_rank,
            world_size=trainer.world_size,
            local_rank=trainer.local_rank,
            node=identity.node_name(cfg, os.environ),
            device=pl_module.device,
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            round_key="",
            job=identity.job_id(cfg, os.environ),
            config=cfg,
            groups={"monitor": dist.new_group(backend="gloo")} if many else {},
        )
        self.journal = Journal(self.env)
        if self._ckpt_dir(trainer):
            self.journal.storage = open_storage(self._ckpt_dir(trainer))
        self._drain = drain.Drain(
            cfg.drain, world_size=self.env.world_size, group=self.env.groups.get("monitor")
        )
        self._take_sigterm(trainer)

    def _take_sigterm(self, trainer: Any) -> None:
        """Lightning raises SIGTERMException on each rank's own flag, at its own batch, so one
        rank can reach save_checkpoint's barrier while the other trains (Lightning-AI/
        pytorch-lightning#20806); since PR #20825 (2.6.6 here) its handler also broadcasts
        from rank 0 *inside the signal handler*, wherever each rank is: a rank that gets the
        signal while its peer waits in another collective (DDP's gradient all-reduce, the
        all-gather of on_train_start) deadlocks the job (both seen in the tests). The
        drain's handler only raises a flag, and the ranks agree on it at a batch end.
        Taken here, before Lightning registers its handlers (after `setup`, composing its
        notifier with the handler it finds): its notifier becomes the drain's too."""
        assert self._drain is not None
        if not self._drain.install():
            return  # drain off (or not the main thread): Lightning's handling stays
        connector = getattr(trainer, "_signal_connector", None)
        if connector is not None and hasattr(connector, "_sigterm_notifier_fn"):
            connector._sigterm_notifier_fn = self._drain.handle
        else:
            log.warning("gpuvigil drain: this Lightning has no _sigterm_notifier_fn to replace")

    def _keep_sigterm(self, trainer: Any) -> None:
        """Lightning has registered its handlers: the drain's alone from here on, and the
        handler from before `setup` is the one Lightning restores at its teardown."""
        assert self._drain is not None
        if self._drain.installed:
            signal.signal(signal.SIGTERM, self._drain.handle)
            originals = getattr(
                getattr(trainer, "_signal_connector", None), "_original_handlers", None
            )
            if isinstance(originals, dict) and signal.SIGTERM in originals:
                originals[signal.SIGTERM] = self._drain.previous

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        env, cfg = self.env, self.config
        assert env is not None and self.journal is not None and self._drain is not None
        self._keep_sigterm(trainer)
        # The launcher learns who each rank is (and where rank 0 writes events) from its
        # heartbeat and sidecar: both exist before the refusal below, so a job that exits
        # 92 still gets its job.end (failed, 92) from the launcher. The first beat has no
        # timeout: the monitor watches the rank once the watchdog gives it one.
        run_dir = os.environ.get(heartbeat.RUN_DIR_ENV)
        if run_dir:
            self._hb = heartbeat.HeartbeatWriter(
                Path(run_dir), local_rank=env.local_rank, info=env.describe()
            )
            self._hb.state(timeout_s=0.0, paused=False, now=time.monotonic())
        self._check_resumable(trainer)
        self._step = trainer.global_step
        self._models = [trainer.strategy.model]  # wrapped (DDP) by now
        log.info("gpuvigil: training starts at step %d", trainer.global_step)
        self.journal.open(cfg.events_file)
        if cfg.watchdog.enabled:
            self._watchdog = watchdog.Watchdog(
                cfg.watchdog,
                rank=env.rank,
                node=env.node,
                dump_dir=Path(trainer.default_root_dir),
                on_fire=self._hung,
                heartbeat=self._hb,
                world_size=env.world_size,
                collective_seq=process_group.collective_seq(),
            ).start()
        nodes = [env.node]
        if "monitor" in env.groups:
            nodes = [None] * env.world_size
            dist.all_gather_object(nodes, env.node, group=env.groups["monitor"])
            if cfg.straggler.enabled:
                self._stragglers = StragglerWatch(self, nodes=nodes)  # type: ignore[arg-type]
        self.journal.started(nodes=nodes, resumed_step=trainer.global_step, saved_ts=None)

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        dt = time.perf_counter() - self._t0
        self._batches += 1
        for dl in _train_loaders(trainer):  # before any checkpoint of this batch is written
            if isinstance(dl, ResumableLoader):
                dl.advance()
        if self._watchdog is not None:
            self._watchdog.kick(trainer.global_step, dt)
        if self._stragglers is not None:  # windows count batches: the same on every rank
            self._stragglers.completed(self._batches, dt)
        self._step_s += dt
        step = trainer.global_step
        if step == self._step:  # gradient accumulation: no optimizer step, nothing to save
            return
        self._step, step_s, self._step_s = step, self._step_s, 0.0
        # Every rank reaches this point after every optimizer step, in the same order: the
        # drain's all-reduce (on the monitor group, every K steps) is where they agree.
        if self._drain is not None and self._drain.after_step(step, step_s):
            self._drain_now(trainer, step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()
        if self._drain is not None:  # every rank issued the last check's all-reduce
            self._drain.close()
        if self.journal is not None:
            self.journal.end(steps=trainer.global_step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop()
        if self._drain is not None:
            self._drain.uninstall()  # no close(): a peer may never issue the pending all-reduce
        assert self.journal is not None
        # the drain's own exits (89, or 90 when its save failed) are in the journal already
        self.journal.exit_of(exception, step=trainer.global_step)
        self.journal.close()

    def _drain_now(self, trainer: Any, step: int) -> None:
        """Every rank stops after this step: save it (save_checkpoint's barrier finds all of
        them here) and end the rank with DRAINED. The save is synchronous, a legitimate stall
        for the hang watchdog as `Run`'s synchronous saves are; the grace period after the
        SIGTERM (torchrun's shutdown timeout, the pod's) bounds it."""
        assert self.journal is not None
        self.metrics.drains.inc()
        path = os.path.join(self._ckpt_dir(trainer) or trainer.default_root_dir, "last.ckpt")
        try:
            with self._watchdog.paused() if self._watchdog is not None else nullcontext():
                trainer.save_checkpoint(path)
        except Exception as e:
            self.journal.exit(
                kind="checkpoint_failed",
                code=exit_codes.CHECKPOINT_FAILED,
                step=step,
                detail=f"drain save failed: {e}"[:300],
            )
            raise checkpoint.CheckpointFailed(
                f"gpuvigil drain: the checkpoint of step {step} failed: {e}"
            ) from e
        log.warning(
            "gpuvigil drain: stopped after step %d with %s saved; exiting with code %d",
            step,
            path,
            exit_codes.DRAINED,
        )
        self.journal.exit(
            kind="drained", code=exit_codes.DRAINED, step=step, detail=f"SIGTERM; saved {path}"
        )
        raise drain.Drained(step)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop()
        if self._hb is not None:
            self._hb.close()
            self._hb = None
        if self.journal is not None:
            self.journal.close()

    # --- helpers --------------------------------------------------------------------------
    def _check_resumable(self, trainer: Any) -> None:
        """Refuse before the first step (fail closed): a drain or a kill can come in any
        batch, and the resume from it must continue the same epoch at the same sample."""
        loaders = _train_loaders(trainer)
        total = trainer.num_training_batches
        ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        done = ready % total if isinstance(total, int) and total > 0 else ready
        reasons = (
            not_resumable(
                loaders, rank=trainer.global_rank, world_size=trainer.world_size, batches_done=done
            )
            if loaders
            else ["no train dataloader found in the trainer (this Lightning's fit loop differs)"]
        )
        if not reasons:
            return
        text = "; ".join(reasons)
        if self.allow_inexact_resume:
            log.warning("gpuvigil: resume may be inexact (allow_inexact_resume=True): %s", text)
            return
        raise NotResumable(
            f"gpuvigil: refusing to train: {text}. Use gpuvigil.training.loader.ResumableLoader"
            " (dataset, ResumableSampler(...)) as examples/train_lightning.py does, or"
            " Resilience(allow_inexact_resume=True) to accept a resume that differs from an"
            " uninterrupted run"
        )

    def _stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._stragglers is not None:
            self._stragglers.flush()
            self._stragglers = None

    def _ckpt_dir(self, trainer: Any) -> str | None:
        cb = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
        return (cb.dirpath if cb is not None and cb.dirpath else None) or self.config.checkpoint.dir

    def _hung(self, record: watchdog.HangRecord) -> None:
        self.metrics.hangs.inc()
        assert self.journal is not None
        self.journal.hung(record)


def _train_loaders(trainer: Any) -> list[object]:
    """The train loaders as Lightning iterates them (after its own wrapping)."""
    combined = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
    return list(getattr(combined, "flattened", None) or [])
