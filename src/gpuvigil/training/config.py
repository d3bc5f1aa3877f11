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
        description="async: training stalls only for the copy to host memory; the write, "
        "verification and commit run in a background thread. sync: stall for all of it.",
    )
    checksums: bool = Field(
        True,
        description="Record a SHA-256 per file in the manifest and verify it on load. Costs one "
        "read of the checkpoint per save (in the background when async) and per load.",
    )
    save_final: bool = Field(True, description="Also save after the last step of `steps(n)`.")


class StragglerConfig(StrictModel):
    enabled: bool = True
    every_steps: int = Field(
        20, ge=1, description="Gather per-rank step times every K steps: one tiny all-gather."
    )
    factor: float = Field(
        1.5, gt=1.0, description="A rank is slow in a window when its time > factor * median."
    )
    min_excess_s: float = Field(
        0.005,
        ge=0.0,
        description="...and exceeds the median by at least this many seconds: millisecond "
        "steps jitter by more than 50% on a shared CPU, which is not a straggler.",
    )
    windows: int = Field(
        3, ge=1, description="Report after M consecutive slow windows (filters one-off hiccups)."
    )


class WatchdogConfig(StrictModel):
    enabled: bool = True
    timeout_s: float | None = Field(
        None,
        gt=0,
        description="Fixed hang timeout. None: derived from observed step times "
        "(factor * p99 after warmup, at least min_timeout_s).",
    )
    initial_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Timeout before enough steps were seen to derive one: the first steps "
        "include compilation, cache warmup and checkpoint load.",
    )
    warmup_steps: int = Field(10, ge=1, description="Steps observed before deriving a timeout.")
    factor: float = Field(10.0, gt=1.0, description="Derived timeout = factor * p99 step time.")
    min_timeout_s: float = Field(
        60.0, gt=0, description="Floor of the derived timeout: GC pauses, page cache flushes."
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


class TrainingConfig(StrictModel):
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    straggler: StragglerConfig = Field(default_factory=StragglerConfig)
    watchdog: WatchdogConfig = Field(default_factory=WatchdogConfig)
    health_gate: HealthGateConfig = Field(default_factory=HealthGateConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    events_file: Path | None = Field(
        None,
        description="Append straggler, hang, checkpoint and restart events (JSONL, "
        "core.events) here for the platform. Env GPUVIGIL_EVENTS_FILE also sets it.",
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
        if overrides:
            data = core_config.deep_merge(data, overrides)
        return core_config.validate(cls, data, source=source)
