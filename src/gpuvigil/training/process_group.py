"""Process-group setup that makes every torchrun restart clean, without the user knowing why.

Called once per worker by the user's script (`training.init()`), before building the model.
It runs the health gate, then forms the process group on a store prefix unique to this
attempt (see `round_key`). Why: torchrun's agent shares one TCPStore with its workers for
the whole job, and restarted workers find the dead attempt's keys there
(pytorch/pytorch#135712); on gloo about half the restarts then fail (`Gloo connectFullMesh
failed`) or hang. Also picks the backend and device: NCCL on GPUs (with gloo for
CPU tensors, which async checkpointing and the monitoring side groups need), gloo on CPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from gpuvigil.core.findings import utcnow
from gpuvigil.training import health_gate, identity
from gpuvigil.training.config import TrainingConfig

log = logging.getLogger("gpuvigil.training")


@dataclass
class Env:
    """What a worker knows about itself and its job after `init`."""

    rank: int
    world_size: int
    local_rank: int
    node: str
    device: torch.device
    restart_count: int  # TORCHELASTIC_RESTART_COUNT of this agent; in-process: the generation
    round_key: str  # the store prefix of this attempt
    job: str | None
    config: TrainingConfig
    store: Any = None  # this attempt's (prefixed) store, for the watchdog's peer signal
    groups: dict[str, Any] = field(default_factory=dict)  # side groups: "checkpoint", "monitor"
    store_addr: tuple[str, int] = ("", 0)  # where the per-node monitor reaches `store`
    # When this worker reached `init` (interpreter up, torch imported) and when its process
    # group formed: the process-start and rendezvous phases of a restart (startup).
    init_ts: float | None = None
    group_ts: float | None = None
    # This process trained in an earlier generation of an in-process restart (`inprocess`):
    # its state is past step 0, so a restore that finds nothing cannot start it at step 0.
    survivor: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        """Who this rank is, for the per-node monitor (the heartbeat's sidecar)."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "node": self.node,
            "job": self.job,
            "attempt": self.restart_count,
            "store_host": self.store_addr[0],
            "store_port": self.store_addr[1],
            "store_prefix": self.round_key,
            "checkpoint_dir": _absolute(self.config.checkpoint.dir),
            "events_file": _absolute(self.config.events_file),
        }


def _absolute(path: Any) -> str | None:
    """A path as the monitor (another process, maybe another directory) must read it."""
    if path is None:
        return None
    text = str(path)
    return text if "://" in text else os.path.abspath(text)


def _connect(env: dict[str, str], *, rank: int, world_size: int, timeout: timedelta) -> Any:
    host, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    return dist.TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=timeout, multi_tenant=True
    )


def round_key(env: dict[str, str]) -> str:
    """A store prefix that every rank of this attempt computes alike.

    torchrun shares its agent's store with the workers (TORCHELASTIC_USE_AGENT_STORE=True)
    for the whole job: each attempt then needs its own prefix. With one agent (one node),
    its restart count is exact. With several agents the counts can differ (an agent whose
    workers were healthy restarts them for a membership change without counting it), so
    multi-node jobs launch with `python -m gpuvigil.training.launch` (torchrun with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1): every round then gets a fresh store from the
    rendezvous, and no prefix is needed.
    """
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "false":
        return "gpuvigil/attempt"
    if int(env.get("GROUP_WORLD_SIZE", "1")) > 1:
        log.warning(
            "gpuvigil: %s nodes share torchrun's rendezvous store across restarts; a restart "
            "can then hang. Launch with `python -m gpuvigil.training.launch` (or set "
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun) on every node.",
            env["GROUP_WORLD_SIZE"],
        )
    return f"gpuvigil/restart-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def init(
    config: TrainingConfig | None = None,
    *,
    backend: str | None = None,
    timeout_s: float = 600.0,
) -> Env:
    """Health gate, then the process group; returns who this worker is.

    Exits with `exit_codes.NODE_UNHEALTHY` / `NODE_STATE_UNKNOWN` when the gate refuses.
    """
    init_ts = time.time()
    config = config or TrainingConfig.load()
    if config.restart.in_process:
        raise ValueError(
            "training.restart.in_process is set: start the job with training.in_process(train) "
            "(gpuvigil.training.inprocess), which re-forms the group when a rank is lost; "
            "init() alone cannot"
        )
    gate(config)
    env = dict(os.environ)
    rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    base = _connect(env, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    return form(
        config,
        base=base,
        key=round_key(env),
        restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        init_ts=init_ts,
        backend=backend,
        timeout_s=timeout_s,
    )


def gate(config: TrainingConfig) -> None:
    """The health gate: raises `health_gate.NodeRefused` (the rank exits 87/88) when it refuses."""
    verdict = health_gate.check(config.health_gate, now=utcnow())
    if not verdict.allowed:
        log.error("%s (exit code %d)", verdict.message, verdict.exit_code)
        raise health_gate.NodeRefused(verdict)
    log.info(verdict.message)


def form(
    config: TrainingConfig,
    *,
    base: Any,
    key: str,
    restart_count: int,
    init_ts: float,
    backend: str | None = None,
    timeout_s: float = 600.0,
) -> Env:
    """The process group and its side groups on `base` under the prefix `key` (an attempt's,
    or an in-process restart's generation)."""
    env = dict(os.environ)
    rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = backend or "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = backend or "gloo"
    timeout = timedelta(seconds=timeout_s)
    store = dist.PrefixStore(key, base)
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    groups = {
        # Side groups so a background checkpoint and the straggler gather never interleave
        # their collectives with the training's or each other's.
        "checkpoint": dist.new_group(backend="gloo", timeout=timeout),
        "monitor": dist.new_group(backend="gloo", timeout=timedelta(seconds=60)),
        # The in-memory tier's peer copies (`memtier`): point-to-point, on the tier's own thread
        # (the copy runs off the training thread; nothing else uses this group).
        "memtier": dist.new_group(backend="gloo", timeout=timeout),
    }
    group_ts = time.time()  # the group and its side groups exist: rendezvous is over
    watch_store = dist.PrefixStore(
        key,
        dist.TCPStore(
            base.host, base.port, world_size, is_master=False, timeout=timedelta(seconds=5)
        ),
    )
    node = identity.node_name(config, env)
    log.info(
        "rank %d/%d on %s: process group %s on store prefix %s (restart %s)",
        rank,
        world_size,
        node,
        backend,
        key,
        restart_count,
    )
    return Env(
        rank,
        world_size,
        local_rank,
        node,
        device,
        restart_count,
        key,
        identity.job_id(config, env),
        config,
        watch_store,
        groups,
        (base.host, base.port),
        init_ts,
        group_ts,
    )


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def collective_seq() -> Callable[[], int] | None:
    """The default group's collective sequence number (collectives this rank has entered;
    gloo and NCCL count them as they are issued), for the watchdog and the heartbeat; None
    without a process group."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    group = dist.distributed_c10d._get_default_group()
    get = getattr(group, "_get_sequence_number_for_group", None)
    return get if callable(get) else None
