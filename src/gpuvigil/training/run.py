"""`Run`: the one object a training script uses; restores state and yields steps.

    env = training.init()                      # health gate + process group (process_group)
    model = DDP(Net().to(env.device)); opt = ...; sched = ...
    with training.Run(env, model=model, optimizer=opt, scheduler=sched, sampler=s) as run:
        for step in run.steps(total):          # starts after the restored step
            ...forward, backward, optimizer step...

Between two steps (when the loop asks for the next one) the Run kicks the hang watchdog,
records metrics, every K steps gathers step times for straggler detection, and every N
steps saves a checkpoint. Nothing else is called per step.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.training import checkpoint, metrics, straggler, watchdog
from gpuvigil.training.process_group import Env
from gpuvigil.training.sampler import ResumableSampler

log = logging.getLogger("gpuvigil.training")


class Run:
    def __init__(
        self,
        env: Env,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        sampler: ResumableSampler | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.env, self.config = env, env.config
        self.model, self.optimizer, self.scheduler, self.sampler = (
            model,
            optimizer,
            scheduler,
            sampler,
        )
        self.extra = extra if extra is not None else {}  # user state, saved with rank 0's file
        self.start_step = 0
        self.step = 0  # completed steps
        self.registry = CollectorRegistry()
        self.metrics = metrics.build(self.registry)
        self._events: EventWriter | None = None
        self._ckpt: checkpoint.Checkpointer | None = None
        self._watchdog: watchdog.Watchdog | None = None
        self._detector: straggler.Detector | None = None
        self._fwd_end: float | None = None
        self._local_sum = 0.0
        self._gather: tuple[int, list[torch.Tensor], Any] | None = None  # in flight
        self._hook: Any = None
        self._last_saved = -1

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> Run:
        cfg, env = self.config, self.env
        if cfg.metrics.port is not None:
            start_http_server(cfg.metrics.port + env.local_rank, registry=self.registry)
        if cfg.events_file is not None:
            self._events = EventWriter(Path(cfg.events_file))
        if cfg.checkpoint.dir is not None:
            self._ckpt = checkpoint.Checkpointer(
                cfg.checkpoint,
                rank=env.rank,
                world_size=env.world_size,
                group=env.groups["checkpoint"],
                on_saved=self._saved,
            )
        if cfg.watchdog.enabled:
            self._watchdog = watchdog.Watchdog(
                cfg.watchdog,
                rank=env.rank,
                node=env.node,
                dump_dir=self._dump_dir(),
                on_fire=self._hung,
                store=env.store,
            ).start()
        self._restore()
        if cfg.straggler.enabled and env.world_size > 1:
            nodes: list[Any] = [None] * env.world_size
            dist.all_gather_object(nodes, env.node, group=env.groups["monitor"])
            self._detector = straggler.Detector(cfg.straggler, nodes=nodes)
        self._hook = self.model.register_forward_hook(self._forward_done)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._ckpt is not None:
            self._ckpt.close()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._hook is not None:
            self._hook.remove()
        self._write_textfile()
        if self._events is not None:
            self._events.close()

    # --- the loop -----------------------------------------------------------------------
    def steps(self, total: int) -> Iterator[int]:
        """Yield the 0-based index of each step still to run, from the restored position."""
        for step in range(self.start_step, total):
            self._fwd_end = None
            t0 = time.perf_counter()
            yield step
            t1 = time.perf_counter()
            self._completed(step + 1, t1 - t0, (self._fwd_end or t1) - t0)
        if self._gather is not None:  # judge the last window too
            self._judge(*self._gather)
            self._gather = None
        if (
            self._ckpt is not None
            and self.config.checkpoint.save_final
            and self.step > self._last_saved
            and self.step > 0
        ):
            self.save()

    def _forward_done(self, *_: Any) -> None:
        self._fwd_end = time.perf_counter()

    def _completed(self, step: int, dt: float, local_s: float) -> None:
        if step == self.start_step + 1:  # restart latency ends here; logged once per attempt
            log.info("gpuvigil: first step of this attempt done (step %d, %.3fs)", step, dt)
        self.step = step
        if self.sampler is not None:
            self.sampler.advance()
        if self._watchdog is not None:
            self._watchdog.kick(step, dt)
        m = self.metrics
        m.step_duration.observe(dt)
        m.step.set(step)
        m.last_step_timestamp.set(time.time())
        if self._detector is not None:
            self._local_sum += local_s
            k = self.config.straggler.every_steps
            if step % k == 0:
                self._gather_step_times(step, self._local_sum / k)
                self._local_sum = 0.0
        if self._ckpt is not None and step % self.config.checkpoint.every_steps == 0:
            self.save()

    def _gather_step_times(self, step: int, mean_local_s: float) -> None:
        """Start this window's all-gather and judge the previous one's: the gather runs in
        gloo's background threads, so no rank waits for its peers here (the previous
        window's result has long arrived when the next window ends)."""
        assert self._detector is not None
        previous, self._gather = self._gather, None
        out = [torch.zeros(1, dtype=torch.float64) for _ in range(self.env.world_size)]
        work = dist.all_gather(
            out,
            torch.tensor([mean_local_s], dtype=torch.float64),
            group=self.env.groups["monitor"],
            async_op=True,
        )
        self._gather = (step, out, work)
        if previous is not None:
            self._judge(*previous)

    def _judge(self, step: int, out: list[torch.Tensor], work: Any) -> None:
        assert self._detector is not None
        work.wait()
        found = self._detector.observe([float(t.item()) for t in out], step=step)
        if self.env.rank != 0:
            return
        for s in found:
            log.warning(
                "gpuvigil straggler: rank %d on node %s is %.1fx slower than its peers "
                "(local step time %.1f ms vs median %.1f ms) for %d consecutive windows of %d "
                "steps, at step %d",
                s.rank,
                s.node,
                s.ratio,
                s.local_s * 1e3,
                s.peers_median_s * 1e3,
                s.windows,
                self.config.straggler.every_steps,
                s.step,
            )
            self.metrics.stragglers.labels(node=s.node).inc()
            self._event(
                Kind.STRAGGLER,
                node=s.node,
                data={
                    "rank": s.rank,
                    "ratio": round(s.ratio, 3),
                    "windows": s.windows,
                    "step": s.step,
                    "local_s": round(s.local_s, 6),
                    "peers_median_s": round(s.peers_median_s, 6),
                },
            )

    # --- checkpoints --------------------------------------------------------------------
    def _tensors(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def save(self) -> None:
        """Checkpoint the completed steps now (the loop calls this every N steps)."""
        assert self._ckpt is not None
        state = {
            "rng": checkpoint.capture_rng(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "extra": self.extra,
            "saved_ts": time.time(),
        }
        if self.config.checkpoint.mode == "sync" and self._watchdog is not None:
            with self._watchdog.paused():
                stall = self._ckpt.save(self.step, self._tensors(), state)
        else:
            stall = self._ckpt.save(self.step, self._tensors(), state)
        self.metrics.checkpoint_stall.observe(stall)
        self._last_saved = self.step

    def _saved(self, step: int, duration_s: float, stall_s: float, result: str) -> None:
        self.metrics.checkpoint_duration.labels(
            op="save", mode=self.config.checkpoint.mode
        ).observe(duration_s)
        if self.env.rank == 0:
            self._event(
                Kind.CHECKPOINT,
                data={
                    "step": step,
                    "duration_s": round(duration_s, 4),
                    "stall_s": round(stall_s, 4),
                    "result": result,
                },
            )
        self._write_textfile()

    def _restore(self) -> None:
        env = self.env
        if env.restart_count > 0:
            self.metrics.restarts.inc()
        if self._ckpt is None:
            return
        t0 = time.monotonic()
        wd = self._watchdog.paused() if self._watchdog is not None else None
        if wd is not None:
            wd.__enter__()
        try:
            loaded = self._ckpt.load(self._tensors)
        finally:
            if wd is not None:
                wd.__exit__(None, None, None)
        self.metrics.checkpoint_fallbacks.inc(self._ckpt.fallbacks)
        if loaded is None:
            log.info(
                "gpuvigil checkpoint: none found in %s; starting at step 0",
                self.config.checkpoint.dir,
            )
            return
        step, tensors, own, main = loaded
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=tensors["model"],
            optim_state_dict=tensors["optim"],
        )
        if self.scheduler is not None and main.get("scheduler") is not None:
            self.scheduler.load_state_dict(main["scheduler"])
        if self.sampler is not None and main.get("sampler") is not None:
            self.sampler.load_state_dict(main["sampler"])
        self.extra.update(main.get("extra") or {})
        if own is not None:
            checkpoint.restore_rng(own["rng"])
        else:  # resized: per-rank streams cannot be mapped; seed them reproducibly instead
            seed = self.config.seed * 1_000_003 + step * 1009 + env.rank
            random.seed(seed)
            np.random.seed(seed % 2**32)
            torch.manual_seed(seed)
            log.info(
                "gpuvigil checkpoint: world size changed (%d -> %d): RNG reseeded per rank",
                main.get("world_size"),
                env.world_size,
            )
        self.start_step = self.step = self._last_saved = step
        self.metrics.checkpoint_duration.labels(
            op="load", mode=self.config.checkpoint.mode
        ).observe(time.monotonic() - t0)
        if env.restart_count > 0 and env.rank == 0:
            self._event(
                Kind.JOB_RESTART,
                data={
                    "reason": "torchelastic restart",
                    "attempt": env.restart_count,
                    "resumed_step": step,
                    "lost_s": round(time.time() - float(main.get("saved_ts", time.time())), 3),
                },
            )

    # --- records ------------------------------------------------------------------------
    def _hung(self, record: watchdog.HangRecord) -> None:
        self.metrics.hangs.inc()
        self._event(Kind.HANG, data=record.data())
        self._write_textfile()

    def _event(self, kind: Kind, *, data: dict[str, Any], node: str | None = None) -> None:
        if self._events is None:
            return
        self._events.write(
            Event(
                ts=time.time(),
                kind=kind,
                source="training",
                node=node or self.env.node,
                job=self.env.job,
                data=data,
            )
        )

    def _dump_dir(self) -> Path:
        wd, ck = self.config.watchdog.dump_dir, self.config.checkpoint.dir
        if wd is not None:
            return Path(wd)
        if ck is not None and "://" not in ck:
            return Path(ck) / "hangs"
        return Path.cwd()

    def _write_textfile(self) -> None:
        path = self.config.metrics.textfile
        if path:
            try:
                write_to_textfile(path.format(rank=self.env.rank), self.registry)
            except OSError as e:
                log.warning("metrics textfile %s: %s", path, e)
