"""Budget, rate limit, breaker and exclusions (table-driven)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from helpers import T0, view

from gpuvigil.platform.safety import (
    Gate,
    PoolLimit,
    SafetyConfig,
    excluded,
    pool_limit,
)
from gpuvigil.platform.state import Record, State, episode_start

S = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("size", "absolute", "pct", "limit"),
    [(4, 2, 10.0, 1), (100, 2, 10.0, 2), (100, 50, 10.0, 10), (100, 50, 0.0, 0), (1, 5, 10, 1)],
)
def test_pool_limit_is_the_smaller_and_rounds_up(size, absolute, pct, limit) -> None:  # type: ignore[no-untyped-def]
    cfg = SafetyConfig(max_disrupted=absolute, max_disrupted_percent=pct)
    assert pool_limit("p", size, cfg) == limit


def test_per_pool_override() -> None:
    cfg = SafetyConfig(pools={"inference": PoolLimit(max_disrupted=0)})
    assert pool_limit("inference", 100, cfg) == 0
    assert pool_limit("training", 100, cfg) == 2


def test_gate_counts_stored_disruptions_per_pool() -> None:
    busy = Record(state=State.DRAINING, since=T0)
    nodes = [view(name=f"a{i}", labels={"gpuvigil.io/pool": "a"}) for i in range(20)]
    nodes[0] = view(name="a0", record=busy, labels={"gpuvigil.io/pool": "a"})
    nodes.append(view(name="b0", labels={"gpuvigil.io/pool": "b"}))
    gate = Gate(SafetyConfig(), nodes, now=T0)
    assert gate.in_use["a"] == 1 and gate.limit("a") == 2
    assert gate.fleet_for(nodes[1]).may_disrupt
    gate.consume(nodes[1])
    assert not gate.fleet_for(nodes[2]).may_disrupt
    assert "budget" in gate.fleet_for(nodes[2]).why_not
    assert gate.fleet_for(nodes[-1]).may_disrupt  # another pool has its own budget


def test_rate_limit_counts_recent_actions_from_records() -> None:
    recent = Record(state=State.HEALTHY, last_action_at=T0 - 10 * S)
    nodes = [view(name=f"n{i}", record=recent) for i in range(3)] + [view(name="x")]
    gate = Gate(SafetyConfig(max_actions=3, max_disrupted=100), nodes, now=T0)
    assert not gate.fleet_for(nodes[-1]).may_disrupt
    assert "rate" in gate.fleet_for(nodes[-1]).why_not


def test_episode_start_follows_history() -> None:
    r = Record(state=State.HEALTHY).moved(State.SUSPECT, at=T0, reason="x")
    r = r.moved(State.DRAINING, at=T0 + 60 * S, reason="y")
    assert episode_start(r) == T0
    assert episode_start(Record()) is None


def test_exclusion_by_label() -> None:
    cfg = SafetyConfig(exclude_labels={"gpuvigil.io/exclude": "true", "team": "*"})
    assert excluded(view(labels={"gpuvigil.io/exclude": "true"}), cfg)
    assert excluded(view(labels={"team": "x"}), cfg)
    assert not excluded(view(labels={"gpuvigil.io/exclude": "false"}), cfg)
