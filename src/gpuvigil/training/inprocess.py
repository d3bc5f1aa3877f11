"""In-process restart: when a rank is lost, the survivors keep their processes and re-form.

Opt in with `training.restart.in_process: true` and start the job with
`training.in_process(train)` instead of `init()`: `train(env)` builds the DDP wrapper (or
whatever holds the process group) and runs the `Run`. Anchor: the `inprocess` restart
wrapper of nvidia-resiliency-ext (NVIDIA/nvidia-resiliency-ext, `nvidia_resiliency_ext.
inprocess.Wrapper`), which re-runs a wrapped training function in the same process after a
fault, on a store that outlives the ranks; no code is taken from it. Here:

- **A store that outlives any rank**: `python -m gpuvigil.training.inprocess serve` runs a
  `TCPStore` in a process that is no training rank (torchrun's store lives in the agent,
  and torchrun restarts every worker of a gang when one dies, which is what this avoids).
- **Generations**: generation g forms its group on `PrefixStore(f"{PREFIX}/gen{g}", store)`,
  so a new generation never meets the old one's keys. A rank joins by writing
  `gen{g}/joined/{rank}` and waits (at most `restart.join_timeout_s`) for every rank's key;
  the group then forms and `gen{g}/formed` is set.
- **Which generation**: the store's `gen` counter. A survivor of generation g moves the
  counter from g to g+1 (`compare_set`: whoever comes first moves it, the others read it).
  A process that starts (the job's first, or a lost rank's replacement) joins the counter's
  generation unless that one already formed: a generation that formed without it lost it,
  so it moves the counter on itself. Survivors and replacement meet in the same g+1 whoever
  comes first.
- **When**: the `train` function raised what a rank sees when a peer is gone (gloo's
  closed or reset connection, a `DistError`: `journal.classify`'s "victim"). Any other
  exception (a bug, a drain's 89, a hang's 86) ends the process as before. The `Run` has
  closed itself on the way out (its exit record names this rank a victim).
- **The step**: `train` runs again in the same process; its `Run` restores the newest step
  every rank has in the in-memory tier (`memtier`): the survivors their own copy in host
  memory, the replacement the lost rank's copy fetched from its peer; or the persistent DCP
  checkpoint when the tier is gone or older. So the job continues exactly where it rolled
  back to, bit-identical to an uninterrupted run with deterministic data.
- **No replacement**: the survivors exit with `exit_codes.RANK_NOT_REPLACED` (93) after
  `join_timeout_s`, naming the missing ranks: the whole-job restart takes over.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

from gpuvigil.core import exit_codes
from gpuvigil.training import process_group
from gpuvigil.training.config import RestartConfig, TrainingConfig
from gpuvigil.training.journal import classify
from gpuvigil.training.process_group import Env

log = logging.getLogger("gpuvigil.training")

PREFIX = "gpuvigil/inprocess"
_POLL_S = 0.05
T = TypeVar("T")


class RankNotReplaced(SystemExit):
    """Ends a survivor: the lost rank's replacement never joined (exit code 93)."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(exit_codes.RANK_NOT_REPLACED)
        self.message, self.missing = message, missing


def address(config: RestartConfig, environ: dict[str, str] | None = None) -> tuple[str, int]:
    """The job's store server: `restart.store`, else MASTER_ADDR:MASTER_PORT."""
    env = os.environ if environ is None else environ
    text = (
        config.store or f"{env.get('MASTER_ADDR', '127.0.0.1')}:{env.get('MASTER_PORT', '29500')}"
    )
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"training.restart.store: {text!r} is not host:port")
    return host, int(port)


class Rendezvous:
    """The generation protocol on the job's store (see the module's docstring)."""

    def __init__(self, store: Any, *, rank: int, world_size: int, timeout_s: float) -> None:
        self.store = dist.PrefixStore(PREFIX, store)
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s

    def first(self) -> int:
        """The generation a starting process joins (the job's first, or a replacement's)."""
        g = int(self.store.add("gen", 0))
        return self.next(g) if self.formed(g) else g

    def next(self, g: int) -> int:
        """Generation g lost a rank: the one after it (moved by whoever comes first)."""
        return int(self.store.compare_set("gen", str(g), str(g + 1)))

    def formed(self, g: int) -> bool:
        return bool(self.store.check([f"gen{g}/formed"]))

    def join(self, g: int) -> None:
        """Announce this rank for generation g and wait for every rank, or raise
        `RankNotReplaced` naming the ones that never came."""
        self.store.set(f"gen{g}/joined/{self.rank}", str(os.getpid()))
        keys = {r: f"gen{g}/joined/{r}" for r in range(self.world_size)}
        deadline = time.monotonic() + self.timeout_s
        while True:
            missing = [r for r, k in keys.items() if not self.store.check([k])]
            if not missing:
                return
            if time.monotonic() > deadline:
                ranks = ", ".join(map(str, missing))
                message = (
                    f"gpuvigil restart: rank {ranks} never joined generation {g} within "
                    f"{self.timeout_s:g}s (restart.join_timeout_s): no replacement came for the "
                    f"lost rank; rank {self.rank} exits with code {exit_codes.RANK_NOT_REPLACED} "
                    "(RANK_NOT_REPLACED) so that a whole-job restart can take over"
                )
                raise RankNotReplaced(message, missing)
            time.sleep(_POLL_S)

    def mark_formed(self, g: int) -> None:
        self.store.set(f"gen{g}/formed", "1")


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is what a rank sees when a peer is gone."""
    seen: BaseException | None = exc
    while seen is not None:
        if not isinstance(seen, SystemExit) and classify(seen)[0] == "victim":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def connect(config: RestartConfig) -> Any:
    host, port = address(config)
    return dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=config.join_timeout_s)
    )


def in_process(
    train: Callable[[Env], T],
    config: TrainingConfig | None = None,
    *,
    backend: str | None = None,
    timeout_s: float = 600.0,
) -> T:
    """Run `train(env)` with a process group; re-form it and run `train` again in this
    process when a peer is lost (`restart.in_process`). Without it: `init`, `train`,
    `shutdown`, exactly today's behaviour (torchrun restarts the group)."""
    config = config or TrainingConfig.load()
    if not config.restart.in_process:
        env = process_group.init(config, backend=backend, timeout_s=timeout_s)
        try:
            return train(env)
        finally:
            process_group.shutdown()
    rc = config.restart
    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    began = time.time()
    store = connect(rc)
    rdzv = Rendezvous(store, rank=rank, world_size=world_size, timeout_s=rc.join_timeout_s)
    g, restarts, lost_ts = rdzv.first(), 0, None
    while True:
        process_group.gate(config)
        try:
            rdzv.join(g)
        except RankNotReplaced as e:
            log.error("%s", e.message)
            raise
        env = process_group.form(
            config,
            base=store,
            key=f"{PREFIX}/gen{g}",
            restart_count=g,
            init_ts=lost_ts or began,
            backend=backend,
            timeout_s=timeout_s,
        )
        env.survivor = restarts > 0
        rdzv.mark_formed(g)
        if lost_ts is not None:
            log.warning(
                "gpuvigil restart: generation %d formed %.3fs after rank %d lost its peers "
                "(same process, pid %d); resuming",
                g,
                time.time() - lost_ts,
                rank,
                os.getpid(),
            )
        try:
            out = train(env)
        except BaseException as e:
            lost = peer_lost(e)
            if not lost or restarts >= rc.max_restarts:
                del env
                _teardown()
                if lost:
                    log.error(
                        "gpuvigil restart: peer lost again after %d in-process restarts "
                        "(restart.max_restarts)",
                        restarts,
                    )
                raise
            what = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        else:
            process_group.shutdown()
            return out
        # Out of the except block: the exception, and with it the failed train's frames
        # (its Run, its groups), is gone, so _teardown can close the groups' connections.
        del env
        _teardown()
        lost_ts, restarts = time.time(), restarts + 1
        moved = rdzv.next(g)
        log.warning(
            "gpuvigil restart: rank %d lost a peer in generation %d (%s); keeping this "
            "process (pid %d) and waiting up to %gs for every rank to join generation %d",
            rank,
            g,
            what,
            os.getpid(),
            rc.join_timeout_s,
            moved,
        )
        g = moved


def _teardown() -> None:
    """Drop every group of the failed generation, and close their connections now: a peer
    still waiting on this rank (in a collective that did not involve the lost one) then
    fails at once instead of at its timeout. Destroying a group only unregisters it; its
    sockets close when the last reference goes, and the failed `train`'s frames hold some."""
    groups = list(getattr(dist.distributed_c10d._world, "pg_map", {}) or {})
    for group in groups:
        try:
            group.abort()
        except Exception as e:  # noqa: BLE001 - a broken group may refuse; destroy still runs
            log.debug("gpuvigil restart: aborting a group of the failed generation: %s", e)
    try:
        process_group.shutdown()
    except Exception as e:  # noqa: BLE001 - a broken group may fail to close; the next forms anyway
        log.warning("gpuvigil restart: closing the failed generation's group: %s", e)
    gc.collect()


def serve(host: str, port: int, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve the job's store until SIGTERM/SIGINT (`python -m gpuvigil.training.inprocess
    serve`). `ready` gets the port (0 asks for a free one)."""
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if ready is not None:
        ready(store.port)
    stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpuvigil.training.inprocess",
        description="The store an in-process-restart job's ranks rendezvous on; run it on a "
        "machine that is no training rank's (it must outlive every rank).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the job's TCPStore until SIGTERM")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=29500, help="0: a free port (printed)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s store %(message)s")

    def ready(port: int) -> None:
        print(f"gpuvigil store: serving on {args.host}:{port}", flush=True)

    serve(args.host, args.port, ready=ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
