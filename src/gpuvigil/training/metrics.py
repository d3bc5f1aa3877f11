"""The training layer's Prometheus metric families (canonical names from the project brief).

Called by `run.Run`, which builds them on its own `CollectorRegistry` (nothing is registered
at import) and exposes them over HTTP (`metrics.port`) or as a textfile for node_exporter
(`metrics.textfile`). Every rank has its own registry; straggler counts come from rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

_STEP_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_CKPT_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class TrainingMetrics:
    step_duration: Histogram
    step: Gauge
    last_step_timestamp: Gauge
    stragglers: Counter
    hangs: Counter
    restarts: Counter
    checkpoint_duration: Histogram
    checkpoint_stall: Histogram
    checkpoint_fallbacks: Counter
    checkpoint_failures: Counter
    checkpoint_consecutive_failures: Gauge
    checkpoint_verified_bytes: Counter
    drains: Counter


def build(registry: CollectorRegistry) -> TrainingMetrics:
    disable_created_metrics()  # no `<name>_created` series (docs/metrics.md)
    return TrainingMetrics(
        step_duration=Histogram(
            "gpuvigil_training_step_duration_seconds",
            "Wall time of one training step on this rank.",
            buckets=_STEP_BUCKETS,
            registry=registry,
        ),
        step=Gauge("gpuvigil_training_step", "Last completed training step.", registry=registry),
        last_step_timestamp=Gauge(
            "gpuvigil_training_last_step_timestamp_seconds",
            "Unix time of the last completed step (alert when it stops moving).",
            registry=registry,
        ),
        stragglers=Counter(
            "gpuvigil_training_stragglers_total",
            "Straggler reports: a rank slower than its peers for M consecutive windows.",
            ["node"],
            registry=registry,
        ),
        hangs=Counter(
            "gpuvigil_training_hangs_total",
            "Times the hang watchdog fired on this rank.",
            registry=registry,
        ),
        restarts=Counter(
            "gpuvigil_training_restarts_total",
            "Group restarts this worker resumed from (TORCHELASTIC_RESTART_COUNT > 0).",
            registry=registry,
        ),
        checkpoint_duration=Histogram(
            "gpuvigil_training_checkpoint_duration_seconds",
            "Checkpoint save (stage, write, verify, commit) or load (verify, read) time.",
            ["op", "mode"],
            buckets=_CKPT_BUCKETS,
            registry=registry,
        ),
        checkpoint_stall=Histogram(
            "gpuvigil_training_checkpoint_stall_seconds",
            "Time training was blocked by a checkpoint save.",
            buckets=_CKPT_BUCKETS,
            registry=registry,
        ),
        checkpoint_fallbacks=Counter(
            "gpuvigil_training_checkpoint_fallbacks_total",
            "Checkpoints skipped on load for an older one: damaged (a file fails its size or "
            "SHA-256 check, or the manifest is unreadable) or uncommitted (an interrupted save).",
            ["reason"],
            registry=registry,
        ),
        checkpoint_failures=Counter(
            "gpuvigil_training_checkpoint_failures_total",
            "Checkpoint saves that failed to commit (every rank counts each failed save).",
            registry=registry,
        ),
        checkpoint_consecutive_failures=Gauge(
            "gpuvigil_training_checkpoint_consecutive_failures",
            "Failed saves in a row; the job ends at checkpoint.max_consecutive_failures.",
            registry=registry,
        ),
        checkpoint_verified_bytes=Counter(
            "gpuvigil_training_checkpoint_verified_bytes_total",
            "Bytes this rank verified (size and SHA-256) before loading: its share only.",
            registry=registry,
        ),
        drains=Counter(
            "gpuvigil_training_drains_total",
            "SIGTERM drains: the step finished, a checkpoint saved, exit code 89.",
            registry=registry,
        ),
    )
