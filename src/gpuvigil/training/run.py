"""`Run`: the one object a training script uses; restores state and yields steps.

    env = training.init()                      # health gate + process group (process_group)
    model = DDP(Net().to(env.device)); opt = ...; sched = ...
    with training.Run(env, model=model, optimizer=opt, scheduler=sched, sampler=s) as run:
        for step in run.steps(total):          # starts after the restored step
            ...forward, backward, optimizer step...

`model`, `optimizer` and `scheduler` may be lists: the model parts of a pipeline stage (a
rank may hold several), each with its optimizer and scheduler, as torchtitan builds them.
Between two steps (when the loop asks for the next one) the Run kicks the hang watchdog and
the heartbeat, records metrics, every K steps gathers busy times for straggler detection
(`straggler_watch`), checks whether a drain was asked for (`drain`), and every N steps
saves a checkpoint. Nothing else is called per step.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile

from gpuvigil.core import exit_codes
from gpuvigil.training import (
    checkpoint,
    drain,
    heartbeat,
    manifest,
    memtier,
    metrics,
    process_group,
    resume,
    run_state,
    tensor_tree,
    watchdog,
)
from gpuvigil.training.journal import Journal
from gpuvigil.training.process_group import Env
from gpuvigil.training.sampler import ResumableSampler
from gpuvigil.training.straggler_watch import StragglerWatch

log = logging.getLogger("gpuvigil.training")


def _listed(x: Any) -> list[Any]:
    if x is None:
        return []
    return list(x) if isinstance(x, list | tuple) else [x]


class NothingToRollBack(RuntimeError):
    """An in-process restart (`inprocess`) found no step to roll the survivors back to."""


class Run:
    def __init__(
        self,
        env: Env,
        *,
        model: torch.nn.Module | list[torch.nn.Module],
        optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer],
        scheduler: Any = None,
        sampler: ResumableSampler | None = None,
        extra: dict[str, Any] | None = None,
        extra_global: dict[str, Any] | None = None,
    ) -> None:
        self.env, self.config = env, env.config
        self.models, self.optimizers = _listed(model), _listed(optimizer)
        self.schedulers = _listed(scheduler)
        if len(self.models) != len(self.optimizers):
            raise ValueError(
                f"Run: {len(self.models)} model parts but {len(self.optimizers)} optimizers "
                "(one optimizer per part, as torchtitan builds them)"
            )
        self.sampler = sampler
        # Saved per rank and restored on the same rank (a data-parallel rank's iterator).
        self.extra = extra if extra is not None else {}
        # Saved by rank 0 and restored on every rank, whatever the world size.
        self.extra_global = extra_global if extra_global is not None else {}
        self.start_step = self.step = 0  # completed steps
        self.registry = CollectorRegistry()
        self.metrics = metrics.build(self.registry)
        self.journal = Journal(env)
        self._ckpt: checkpoint.Checkpointer | None = None
        self._mem: memtier.MemTier | None = None
        self._tier: tuple[str, str] = ("", "")  # the tier restored from, and why not memory
        self._watchdog: watchdog.Watchdog | None = None
        self._hb: heartbeat.HeartbeatWriter | None = None
        self._drain = drain.Drain(
            env.config.drain, world_size=env.world_size, group=env.groups.get("monitor")
        )
        self._stragglers: StragglerWatch | None = None
        self._last_saved = -1
        self._restored_ts: float | None = None  # set when __enter__'s restore is done
        self._finished = False

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> Run:
        cfg, env = self.config, self.env
        if cfg.metrics.port is not None:
            start_http_server(cfg.metrics.port + env.local_rank, registry=self.registry)
        self.journal.open(cfg.events_file)
        run_dir = os.environ.get(heartbeat.RUN_DIR_ENV)
        if run_dir:
            self._hb = heartbeat.HeartbeatWriter(
                Path(run_dir), local_rank=env.local_rank, info=env.describe()
            )
        if cfg.checkpoint.dir is not None:
            self._ckpt = checkpoint.Checkpointer(
                cfg.checkpoint,
                rank=env.rank,
                world_size=env.world_size,
                group=env.groups["checkpoint"],
                on_outcome=self._saved,
            )
            self.journal.storage = self._ckpt.storage
        if cfg.memtier.enabled:
            self._mem = memtier.MemTier(
                cfg.memtier,
                rank=env.rank,
                world_size=env.world_size,
                group=env.groups["memtier"],
                job=env.job or "job",
                node=env.node,
            )
        if cfg.watchdog.enabled:
            self._watchdog = watchdog.Watchdog(
                cfg.watchdog,
                rank=env.rank,
                node=env.node,
                dump_dir=self._dump_dir(),
                on_fire=self._hung,
                store=env.store,
                heartbeat=self._hb,
                world_size=env.world_size,
                collective_seq=process_group.collective_seq(),
            ).start()
        self._drain.install()
        nodes = [env.node]
        if env.world_size > 1:
            nodes = [None] * env.world_size
            dist.all_gather_object(nodes, env.node, group=env.groups["monitor"])
        try:
            self._restore(nodes)
        except BaseException as e:  # no verified checkpoint: __exit__ is not called for us
            self.__exit__(type(e), e, e.__traceback__)
            raise
        if self._ckpt is not None:  # the first async save's buffer, made before training starts
            with self.paused():
                self._ckpt.prepare(run_state.tensors(self))
        if cfg.straggler.enabled and env.world_size > 1:
            self._stragglers = StragglerWatch(self, nodes=nodes)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc is not None:
                self.journal.exit_of(exc, step=self.step)
            if self._mem is not None:  # the copy in flight finishes (bounded; never raises)
                self._mem.close()
            if self._ckpt is not None:
                self._ckpt.close()
        finally:
            self._drain.close()
            if self._watchdog is not None:
                self._watchdog.stop()
            if self._stragglers is not None:
                self._stragglers.close()
            if self._hb is not None:
                self._hb.finish()
                self._hb.close()
            self._write_textfile()
            self.journal.close()

    # --- the loop -----------------------------------------------------------------------
    def steps(self, total: int) -> Iterator[int]:
        """Yield the 0-based index of each step still to run, from the restored position."""
        for step in range(self.start_step, total):
            t0 = time.perf_counter()
            yield step
            self._completed(step + 1, time.perf_counter() - t0)
        if self._stragglers is not None:
            self._stragglers.flush()
        if self._ckpt is not None:
            if self.config.checkpoint.save_final and self.step > self._last_saved and self.step > 0:
                self.save()
            last = self._ckpt.wait()
            if last is not None and not last.committed and self.config.checkpoint.save_final:
                message = (
                    f"gpuvigil checkpoint: the final save (step {last.step}) failed: {last.error}"
                )
                log.error(message)
                raise checkpoint.CheckpointFailed(message)
        if self._watchdog is not None:  # what follows the loop is not a step: no step timeout
            self._watchdog.stop()
        self._finished = True
        self.journal.end(steps=self.step)

    def paused(self) -> AbstractContextManager[None]:
        """Wrap legitimately long work inside a step (an evaluation pass, a profiler dump)
        so the hang watchdog does not count it: `with run.paused(): evaluate()`."""
        return self._watchdog.paused() if self._watchdog is not None else nullcontext()

    @property
    def draining(self) -> bool:
        """True once this rank was asked to stop (SIGTERM); the loop ends at an agreed step."""
        return self._drain.requested

    def _completed(self, step: int, dt: float) -> None:
        if step == self.start_step + 1:  # restart latency ends here; logged once per attempt
            log.info("gpuvigil: first step of this attempt done (step %d, %.3fs)", step, dt)
            self.journal.ready(
                attempt=self.env.restart_count,
                step=step,
                first_step_s=dt,
                init_ts=self.env.init_ts,
                group_ts=self.env.group_ts,
                restored_ts=self._restored_ts,
            )
        self.step = step
        if self.sampler is not None:
            self.sampler.advance()
        if self._watchdog is not None:
            self._watchdog.kick(step, dt)
        m = self.metrics
        m.step_duration.observe(dt)
        m.step.set(step)
        m.last_step_timestamp.set(time.time())
        if self._stragglers is not None:
            self._stragglers.completed(step, dt)
        if self._drain.after_step(step, dt) and self._drain_now(step):
            return  # the drained ranks are leaving: no periodic save with them at this step
        if self._mem is not None and step % self.config.memtier.every_steps == 0:
            self.save_memory()
        if self._ckpt is not None and step % self.config.checkpoint.every_steps == 0:
            self.save()

    def _drain_now(self, step: int) -> bool:
        """Every rank stops after `step`: all save and exit 89, or (`keeps_survivors`) only
        the signalled ranks do, and this returns True on the others, which train on."""
        self.metrics.drains.inc()
        if self.keeps_survivors():
            self._drain_keeping(step)
            return True
        if self._ckpt is not None:
            if self._last_saved != step:
                self.save()
            out = self._ckpt.wait()
            if out is None or not out.committed:
                why = out.error if out is not None else "no save"
                self.journal.exit(
                    kind="checkpoint_failed",
                    code=exit_codes.CHECKPOINT_FAILED,
                    step=step,
                    detail=f"drain save failed: {why}",
                )
                raise checkpoint.CheckpointFailed(
                    f"gpuvigil drain: the checkpoint of step {step} failed: {why}"
                )
        else:
            log.warning("gpuvigil drain: no checkpoint.dir: the work done so far is lost")
        if self._mem is not None:  # the last copy is whole before the process goes
            self._mem.wait()
        log.warning(
            "gpuvigil drain: stopped after step %d%s; exiting with code %d",
            step,
            " with its checkpoint committed" if self._ckpt is not None else "",
            exit_codes.DRAINED,
        )
        self.journal.exit(
            kind="drained", code=exit_codes.DRAINED, step=step, detail=f"SIGTERM; saved step {step}"
        )
        raise drain.Drained(step)

    def keeps_survivors(self) -> bool:
        """Whether this drain costs only the signalled ranks: an in-process restart
        (`restart.in_process`) with the in-memory tier on, more than one rank, and every
        signalled rank's peer (the rank that holds its copy) staying. Every rank reaches the
        same verdict; the gather of who was signalled (a collective) runs only in this mode."""
        mem = self._mem
        if not self.config.restart.in_process or mem is None or self.env.world_size < 2:
            return False
        return drain.peers_stay(self._drain.signalled(), self.env.world_size, mem.offset)

    def _drain_keeping(self, step: int) -> None:
        """Every rank keeps step `step` in the in-memory tier (collective: each copy goes to
        its peer); then the signalled ranks exit 89 and the others go on, meet the lost
        peers at their next collective, and re-form with the replacements (`inprocess`),
        which fetch the drained ranks' copies of `step` from their peers. No DCP save: it is
        a collective every survivor would wait for, the very stall this avoids, and step
        `step` is already held twice (the survivors' own processes and copies, each drained
        rank's copy in its peer's host memory)."""
        assert self._mem is not None
        self.save_memory()
        gone = ", ".join(map(str, self._drain.signalled()))
        if not self._drain.requested:
            log.warning(
                "gpuvigil drain: rank %s drained after step %d, its copy kept in the in-memory "
                "tier; rank %d keeps its process and re-forms with the replacement",
                gone,
                step,
                self.env.rank,
            )
            return
        self._mem.wait()  # the copy reaches the peer before this process goes
        if self._mem.held != step:
            log.warning(
                "gpuvigil drain: the copy of step %d did not complete; the tier holds step %s, "
                "where the replacement resumes",
                step,
                self._mem.held,
            )
        log.warning(
            "gpuvigil drain: stopped after step %d with its copy in the in-memory tier (held "
            "by peer rank %d); exiting with code %d, the other ranks keep their processes",
            step,
            self._mem.peer,
            exit_codes.DRAINED,
        )
        self.journal.exit(
            kind="drained",
            code=exit_codes.DRAINED,
            step=step,
            detail=f"SIGTERM; step {step} kept in the in-memory tier (peer rank {self._mem.peer})",
        )
        raise drain.Drained(step)

    # --- checkpoints --------------------------------------------------------------------
    def save(self) -> None:
        """Checkpoint the completed steps now (the loop calls this every N steps)."""
        assert self._ckpt is not None
        times = self._watchdog.step_times if self._watchdog else []
        rank_state, job = run_state.rank_state(self), run_state.job_state(self, step_times=times)
        sync = self.config.checkpoint.mode == "sync" and self._watchdog is not None
        with self._watchdog.paused() if sync and self._watchdog else nullcontext():
            stall = self._ckpt.save(self.step, run_state.tensors(self), rank_state, job)
        self.metrics.checkpoint_stall.observe(stall)
        self._last_saved = self.step

    def save_memory(self) -> None:
        """Keep the completed steps in the in-memory tier (here and on the peer rank): the
        step waits for the previous copy and the snapshot; the tier's thread does the rest."""
        assert self._mem is not None
        times = self._watchdog.step_times if self._watchdog else []
        state = {
            "rank": self.env.rank,
            "world_size": self.env.world_size,
            "rank_state": run_state.rank_state(self),
            "job": run_state.job_state(self, step_times=times),
        }
        with self.paused():
            self._mem.save(self.step, run_state.tensors(self), state)

    def _saved(self, out: checkpoint.Outcome) -> None:
        m = self.metrics
        m.checkpoint_duration.labels(op="save", mode=self.config.checkpoint.mode).observe(
            out.duration_s
        )
        m.checkpoint_consecutive_failures.set(out.consecutive_failures)
        if not out.committed:
            m.checkpoint_failures.inc()
        self.journal.checkpoint(out)
        self._write_textfile()

    def _restore(self, nodes: list[str]) -> None:
        env = self.env
        if env.restart_count > 0:
            self.metrics.restarts.inc()
        loaded = None
        if self._mem is not None:
            with self.paused():
                loaded = self._memory_load()
        if loaded is None and self._ckpt is not None:
            t0 = time.monotonic()
            with self.paused():
                loaded = self._ckpt_load()
            if loaded is not None:
                self.metrics.checkpoint_duration.labels(
                    op="load", mode=self.config.checkpoint.mode
                ).observe(time.monotonic() - t0)
        if loaded is None and self.config.restart.in_process and self._any_survivor():
            # A survivor's model and optimizer are past step 0 and nothing can roll them
            # back: every rank (the same verdict, reached collectively) leaves, and a
            # whole-job restart starts them all fresh.
            message = (
                f"gpuvigil restart: generation {env.restart_count} has no in-memory copy and "
                "no checkpoint to roll back to, and the surviving ranks' state is past step 0; "
                "ending this rank so that a whole-job restart starts every rank afresh"
            )
            log.error(message)
            raise NothingToRollBack(message)
        if loaded is None and self._ckpt is not None:
            log.info(
                "gpuvigil checkpoint: none found in %s; starting at step 0",
                self._ckpt.storage.location,
            )
        job = loaded.job if loaded is not None else {}
        self._restored_ts = time.time()  # the restore phase ends here (startup)
        self.journal.started(
            nodes=nodes,
            resumed_step=self.start_step,
            saved_ts=job.get("saved_ts") if loaded is not None else None,
            tier=self._tier[0] or None,
            tier_note=self._tier[1] or None,
        )

    def _any_survivor(self) -> bool:
        """Collective: whether some rank kept its process through an in-process restart."""
        flag = torch.tensor([int(self.env.survivor)])
        if self.env.world_size > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.env.groups["monitor"])
        return bool(flag.item())

    def _memory_load(self) -> resume.Loaded | None:
        """The in-memory tier when it holds a verified step for every rank that is not older
        than the newest committed DCP checkpoint; else None (and why, logged and journaled)."""
        assert self._mem is not None
        env = self.env
        live = run_state.tensors(self)
        flat_live, _ = tensor_tree.split(live)
        got, why = self._mem.restore(set(flat_live))
        newest = self._newest_persistent()
        if got is not None and newest is not None and newest > got.step:
            why, got = f"its step {got.step} is older than the persistent step {newest}", None
        if got is None:
            self._tier = ("persistent", f"in-memory tier not used: {why}")
            if env.restart_count > 0 or why.startswith("step"):
                log.warning("gpuvigil memtier: %s; falling back to the persistent tier", why)
            return None
        flat = {k: got.flat[k].to(v.device) for k, v in flat_live.items()}
        h = got.header
        own = {"world_size": h["world_size"], **h["rank_state"]}
        loaded = resume.Loaded(
            got.step,
            f"memory:{self._mem.holder}",
            tensor_tree.join(h["skeleton"], flat),
            own,
            own,
            h["job"],
        )
        run_state.restore(self, loaded)
        if self._watchdog is not None:
            self._watchdog.seed(loaded.job.get("step_times") or [])
        self.start_step = self.step = loaded.step
        self._tier = ("memory", "fetched from the peer" if got.fetched else "")
        log.info("gpuvigil memtier: resumed at step %d from the in-memory tier", got.step)
        return loaded

    def _newest_persistent(self) -> int | None:
        """The newest committed DCP step (rank 0 reads, every rank gets the same answer)."""
        if self._ckpt is None:
            return None
        newest = None
        if self.env.rank == 0:
            storage = self._ckpt.storage
            newest = next(
                (s for s, f in manifest.candidates(storage) if manifest.read(storage, f)[0]),
                None,
            )
        if self.env.world_size == 1:
            return newest
        box = [newest]
        dist.broadcast_object_list(box, src=0, group=self.env.groups["memtier"])
        return box[0]

    def _ckpt_load(self) -> resume.Loaded | None:
        loaded = run_state.load(self)
        if loaded is not None:
            if self._watchdog is not None:
                self._watchdog.seed(loaded.job.get("step_times") or [])
            self.start_step = self.step = self._last_saved = loaded.step
        return loaded

    # --- records ------------------------------------------------------------------------
    def _hung(self, record: watchdog.HangRecord) -> None:
        self.metrics.hangs.inc()
        self.journal.hung(record)
        self._write_textfile()

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
