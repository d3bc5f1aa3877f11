"""Settings of the training layer: one sub-model per part, composed in `TrainingConfig`.

Read by `gpuvigil.training.run.Run` (and by `process_group.init` for the health gate).
A job loads it from an optional YAML file plus `GPUVIGIL__TRAINING__<PART>__<KEY>`
environment variables (e.g. `GPUVIGIL__TRAINING__CHECKPOINT__EVERY_STEPS=100`), so the
same script runs unchanged on a laptop, under torchrun and in a PyTorchJob.
This module does not import torch: the simulator and the docs tests read it too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from gpuvigil.core import config as core_config
from gpuvigil.core.config import StrictModel
from gpuvigil.core.freshness import STATE_FILE_MAX_AGE_S
from gpuvigil.core.wire import STATE_FILE

DEFAULT_NODE_STATE_FILE = STATE_FILE  # the agent's state-file sink


class CheckpointConfig(StrictModel):
    dir: str | None = Field(
        None,
        description="Checkpoint folder (local path, shared file system, or an fsspec URL such "
        "as s3://bucket/run when fsspec is installed). None: no checkpoints.",
    )
    every_steps: int = Field(
        100, ge=1, description="Save after every N completed steps (and after the last one)."
    )
    keep_last: int = Field(
        3, ge=2, description="Committed checkpoints kept; >= 2 so a damaged latest has a fallback."
    )
    mode: Literal["async", "sync"] = Field(
        "async",
        description="async: training stalls only for the copy to host memory; the rank's "
        "writer process writes and hashes the bytes while a background thread commits. "
        "sync: training stalls for all of it.",
    )
    checksums: bool = Field(
        True,
        description="Verify the SHA-256 the manifest records for every file before a load "
        "(each rank its own share). Sums are always computed while writing; false checks "
        "sizes only on load.",
    )
    allow_fresh_start: bool = Field(
        False,
        description="When checkpoints exist but none can be verified (all damaged), start "
        "again at step 0 instead of exiting with code 91 (NO_VERIFIED_CHECKPOINT). The damaged "
        "folders are kept either way, renamed `damaged-step-N`. The launcher's "
        "--allow-fresh-start sets it.",
    )
    save_final: bool = Field(True, description="Also save after the last step of `steps(n)`.")
    max_consecutive_failures: int = Field(
        3,
        ge=0,
        description="End the job with exit code 90 (CHECKPOINT_FAILED) when this many saves "
        "in a row failed; every failed save is logged on every rank, counted in "
        "gpuvigil_training_checkpoint_failures_total and written as a checkpoint event. "
        "0: never end the job for it.",
    )


class MemTierConfig(StrictModel):
    """The in-memory checkpoint tier (`memtier`): the fast first tier before DCP's."""

    enabled: bool = Field(False, description="Keep the in-memory tier (off by default).")
    every_steps: int = Field(
        2,
        ge=1,
        description="Copy each rank's state to host memory, locally and on its peer, every "
        "K completed steps: losing one machine loses at most K steps.",
    )
    dir: str = Field(
        "/dev/shm/gpuvigil/{job}",
        description="The node's holder folder (tmpfs: host memory that outlives the training "
        "process, not a reboot). `{job}`, `{node}` and `{rank}` are filled in; `{rank}` makes "
        "each rank its own 'machine' (tests, one rank per node).",
    )
    keep_last: int = Field(
        2,
        ge=2,
        description="Steps kept per copy; >= 2 so a save cut short on one rank still leaves "
        "a step every rank has.",
    )


class RestartConfig(StrictModel):
    """In-process restart (`inprocess`): survivors keep their processes when a rank is lost."""

    in_process: bool = Field(
        False,
        description="When a rank is lost, the surviving ranks keep their processes and "
        "in-memory state, wait for the lost rank's replacement and re-form the group in a "
        "new generation (`training.in_process(train)`); false: today's whole-group restart.",
    )
    store: str | None = Field(
        None,
        description="host:port of the job's store server (`python -m "
        "gpuvigil.training.inprocess serve`), which outlives every rank. None: "
        "$MASTER_ADDR:$MASTER_PORT.",
    )
    join_timeout_s: float = Field(
        300.0,
        gt=0,
        description="How long the survivors wait for every rank (the lost rank's replacement) "
        "to join the next generation before they exit with code 93 (RANK_NOT_REPLACED), "
        "naming the missing ranks.",
    )
    max_restarts: int = Field(
        10, ge=0, description="In-process restarts per process before a peer loss ends it."
    )


class StragglerConfig(StrictModel):
    enabled: bool = True
    every_steps: int = Field(
        10, ge=1, description="Gather per-rank step times every K steps: one tiny all-gather."
    )
    factor: float = Field(
        1.2,
        gt=1.0,
        description="A rank is slow in a window when its busy time > factor * the median of "
        "the other ranks' (1.2 names a rank 1.3x slower; raise it on noisy machines).",
    )
    min_excess_s: float = Field(
        0.002,
        ge=0.0,
        description="...and exceeds the median by at least this many seconds per step: "
        "millisecond steps jitter by more than 20% on a shared CPU, which is not a straggler.",
    )
    windows: int = Field(
        3, ge=1, description="Report after M slow windows among the last N (see of_windows)."
    )
    of_windows: int = Field(
        5,
        ge=1,
        description="N: a rank that is slow only part of the time (intermittent slowness) "
        "still gets reported when M of its last N windows were slow.",
    )


class WatchdogConfig(StrictModel):
    enabled: bool = True
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Fixed hang timeout. None: derived from observed step times "
        "(factor * p99, at least min_timeout_s).",
    )
    initial_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Timeout of the first step of an attempt, and of the first warmup_steps "
        "when no step times are known yet: these steps include compilation, cache warmup "
        "and the first collectives. A resumed attempt knows the step times of the "
        "checkpoint it resumed from and derives its timeout from them after its first step.",
    )
    warmup_steps: int = Field(10, ge=1, description="Steps observed before deriving a timeout.")
    factor: float = Field(10.0, gt=1.0, description="Derived timeout = factor * p99 step time.")
    min_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Floor of the derived timeout. Pauses that are not hangs reach tens of "
        "seconds: a full garbage collection of a large heap, a page-cache flush or an NFS "
        "stall on a synchronous write, an allocator's defragmentation. Lower it for small, "
        "steady steps; the monitor names a frozen rank at this timeout plus one poll.",
    )
    poll_s: float = Field(1.0, gt=0, description="How often the watchdog thread looks.")
    dump_dir: str | None = Field(
        None,
        description="Where stack dumps go (also printed to stderr). None: the checkpoint "
        "folder's `hangs/`, else the current directory.",
    )


class HealthGateConfig(StrictModel):
    enabled: bool = True
    state_file: Path = Field(
        DEFAULT_NODE_STATE_FILE,
        description="The node agent's state file (a NodeReport JSON). Default: the agent's "
        "default path on tmpfs, so a stale file never survives a reboot.",
    )
    max_age_s: float = Field(
        STATE_FILE_MAX_AGE_S,
        gt=0,
        description="A report older than this (or dated in the future) means the agent is "
        "not running: treated like a missing file (fail closed unless on_missing=allow). "
        "Default: core.freshness.STATE_FILE_MAX_AGE_S, shared with slurm-healthcheck and "
        "npd-plugin.",
    )
    on_missing: Literal["refuse", "allow"] = Field(
        "refuse",
        description="Missing, unreadable or stale state file: refuse (fail closed, the "
        "default) or allow with a warning (for clusters without the agent).",
    )
    refuse_on: Literal["failed", "warning"] = Field(
        "failed", description="Lowest node status that refuses: FAILED (default) or WARNING."
    )


class MetricsConfig(StrictModel):
    port: int | None = Field(
        None, ge=0, description="Serve /metrics on port + LOCAL_RANK. None: no HTTP server."
    )
    textfile: str | None = Field(
        None,
        description="Write metrics to this file (`{rank}` is replaced) after every "
        "checkpoint and at exit, for node_exporter's textfile collector.",
    )


class DrainConfig(StrictModel):
    enabled: bool = True
    check_s: float = Field(
        0.1,
        gt=0,
        description="How often (in step time) the ranks agree whether any of them was asked "
        "to stop: one tiny all-reduce every max(1, check_s / step time) steps.",
    )


class MonitorConfig(StrictModel):
    """The per-node monitor in `python -m gpuvigil.training.launch` (outside the ranks)."""

    poll_s: float = Field(0.5, gt=0, description="How often the monitor reads heartbeats.")
    grace_s: float = Field(
        2.0,
        ge=0,
        description="Extra time past a rank's own hang timeout before the monitor acts: the "
        "rank's watchdog, when it can still run, fires first and names itself.",
    )
    shutdown_timeout_s: int = Field(
        600,
        ge=1,
        description="Seconds torchrun waits for the ranks after a SIGTERM (a drain: finish "
        "the step, save, exit 89) before SIGKILL; torchrun's own default is 30.",
    )


class TrainingConfig(StrictModel):
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    memtier: MemTierConfig = Field(default_factory=MemTierConfig)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    straggler: StragglerConfig = Field(default_factory=StragglerConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    drain: DrainConfig = Field(default_factory=DrainConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    health_gate: HealthGateConfig = Field(default_factory=HealthGateConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    events_file: Path | None = Field(
        None,
        description="Append lifecycle (job.start/restart/end), checkpoint, straggler and hang "
        "events (JSONL, core.events) here for the platform. Env GPUVIGIL_EVENTS_FILE also "
        "sets it.",
    )
    job_id: str | None = Field(
        None,
        description="The job's name in events. Env GPUVIGIL_JOB_ID also sets it; None: "
        "torchrun's rendezvous id (TORCHELASTIC_RUN_ID), which --standalone draws anew at "
        "every launch, so set it to something stable (the Kubernetes Job's name) for a job "
        "that is resubmitted after a drain.",
    )
    node_name: str | None = Field(
        None,
        description="This node's name in events and logs. None: $NODE_NAME (the Kubernetes "
        "downward API, as the agent reads it), else the short host name.",
    )
    seed: int = Field(0, description="Seeds RNGs that cannot be restored after a resize.")

    @classmethod
    def load(
        cls,
        path: Path | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> TrainingConfig:
        """File (or GPUVIGIL_TRAINING_CONFIG), then GPUVIGIL__TRAINING__* env, then overrides."""
        env = os.environ if environ is None else environ
        if path is None and env.get("GPUVIGIL_TRAINING_CONFIG"):
            path = Path(env["GPUVIGIL_TRAINING_CONFIG"])
        data: dict[str, Any] = core_config.read_yaml(path) if path is not None else {}
        data = data.get("training", data) if isinstance(data.get("training"), dict) else data
        source = str(path) if path is not None else "<defaults>"
        section = core_config.env_overrides(env).get("training")
        if isinstance(section, dict) and section:
            data = core_config.deep_merge(data, section)
            source += " (+ environment)"
        if env.get("GPUVIGIL_EVENTS_FILE") and "events_file" not in data:
            data["events_file"] = env["GPUVIGIL_EVENTS_FILE"]
        if env.get("GPUVIGIL_JOB_ID") and "job_id" not in data:
            data["job_id"] = env["GPUVIGIL_JOB_ID"]
        if overrides:
            data = core_config.deep_merge(data, overrides)
        return core_config.validate(cls, data, source=source)
