"""Training metrics carry the canonical names; the store prefix is the same on every rank."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gpuvigil.training import metrics

CANONICAL = {
    "gpuvigil_training_step_duration_seconds",
    "gpuvigil_training_step",
    "gpuvigil_training_last_step_timestamp_seconds",
    "gpuvigil_training_stragglers_total",
    "gpuvigil_training_hangs_total",
    "gpuvigil_training_restarts_total",
    "gpuvigil_training_checkpoint_duration_seconds",
    "gpuvigil_training_checkpoint_stall_seconds",
}


def test_canonical_names_on_an_explicit_registry() -> None:
    reg = CollectorRegistry()
    m = metrics.build(reg)
    m.stragglers.labels(node="gpu7").inc()
    m.checkpoint_duration.labels(op="save", mode="async").observe(1.0)
    names = set()
    for fam in reg.collect():
        for sample in fam.samples:
            names.add(
                sample.name.removesuffix("_bucket")
                .removesuffix("_count")
                .removesuffix("_sum")
                .removesuffix("_created")
            )
    assert names >= CANONICAL
    assert reg.get_sample_value("gpuvigil_training_stragglers_total", {"node": "gpu7"}) == 1.0
    metrics.build(CollectorRegistry())  # nothing global: a second build does not collide


def test_round_key_is_per_attempt_and_needs_no_prefix_on_a_fresh_store() -> None:
    pg = pytest.importorskip("gpuvigil.training.process_group")
    single = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "3"}
    assert pg.round_key(single) == "gpuvigil/restart-3"
    fresh = {"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RESTART_COUNT": "3"}
    assert pg.round_key(fresh) == pg.round_key({**fresh, "TORCHELASTIC_RESTART_COUNT": "0"})
