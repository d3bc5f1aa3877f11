"""The capacity gate for serving pools (table-driven and hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.config import ConfigError, validate
from gpuvigil.platform.capacity import (
    Demand,
    HoldReason,
    PoolState,
    Replica,
    ScaleMark,
    Step,
    StepKind,
    Verdict,
    combine,
    judge,
    required,
    restore_due,
)
from gpuvigil.platform.serving_pool import ServingConfig, ServingPool

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def pool(**kw: object) -> ServingPool:
    data: dict[str, object] = {
        "name": "llm",
        "namespace": "serve",
        "workload": {"kind": "Deployment", "name": "llm"},
        "demand": [{"kind": "hpa", "name": "llm"}],
    }
    data.update(kw)
    return ServingPool.model_validate(data)


def hpa(n: int | None, at: datetime | None = T0, error: str = "") -> Demand:
    return Demand("hpa/llm", n, at, error)


def replicas(spec: list[tuple[str, str]], *, ready: bool = True) -> tuple[Replica, ...]:
    """[(node, gpu)] -> one Ready replica each."""
    return tuple(
        Replica(f"r{i}", node, frozenset({gpu}), ready=ready) for i, (node, gpu) in enumerate(spec)
    )


# four replicas: two on the node being repaired (gpu0 faulty, gpu1 healthy), two elsewhere
FOUR = replicas([("n1", "gpu0"), ("n1", "gpu1"), ("n2", "gpu0"), ("n3", "gpu0")])
DRAIN = Step(StepKind.DRAIN, "n1", faulty=frozenset({"gpu0"}))
RESET = Step(StepKind.RESET_GPU, "n1", faulty=frozenset({"gpu0"}), removes=frozenset({"gpu0"}))


@pytest.mark.parametrize(
    ("d", "percent", "extra", "r"),
    [(0, 0, 0, 0), (0, 0, 1, 1), (10, 10, 0, 11), (10, 10, 2, 12), (3, 50, 0, 5), (4, 0, 0, 4),
     (7, 100, 1, 14), (1, 1, 0, 2)],
)  # fmt: skip
def test_required_rounds_up_and_keeps_the_minimum_extra(d, percent, extra, r) -> None:  # type: ignore[no-untyped-def]
    assert required(d, pool(headroom={"percent": percent, "min_extra": extra})) == r


@pytest.mark.parametrize(
    ("name", "step", "demand", "state_kw", "verdict", "h", "lost"),
    [
        # H counts the three replicas not on the faulty GPU; the drain removes n1/gpu1 (L=1)
        ("room", DRAIN, 1, {}, Verdict.PROCEED, 3, 1),
        ("exact", DRAIN, 2, {}, Verdict.PROCEED, 3, 1),
        ("short", DRAIN, 3, {}, Verdict.SCALE_UP, 3, 1),
        # resetting the faulty GPU removes only its own holder, which H never counted
        ("reset-removes-nothing-healthy", RESET, 4, {}, Verdict.PROCEED, 3, 0),
        ("capped", DRAIN, 3, {"max_replicas": 4}, Verdict.HOLD, 3, 1),
        ("no-gpus", DRAIN, 3, {"spare_gpus": 0}, Verdict.HOLD, 3, 1),
        ("gpus-enough", DRAIN, 3, {"spare_gpus": 1}, Verdict.SCALE_UP, 3, 1),
    ],
)
def test_the_gate_table(name, step, demand, state_kw, verdict, h, lost) -> None:  # type: ignore[no-untyped-def]
    st_ = PoolState(FOUR, (hpa(demand),), desired=4, **state_kw)
    j = judge(pool(), st_, step, now=T0)
    assert (j.verdict, j.healthy, j.removed) == (verdict, h, lost), j.reason
    if verdict is Verdict.SCALE_UP:
        assert j.scale_to == 4 + j.added and j.healthy - j.removed + j.added >= j.required
    if verdict is Verdict.HOLD:
        assert j.hold is HoldReason.NO_ROOM and "no room" in j.reason


def test_the_whole_node_at_fault_counts_none_of_its_replicas() -> None:
    whole = Step(StepKind.DRAIN, "n1")
    j = judge(pool(), PoolState(FOUR, (hpa(2),), desired=4), whole, now=T0)
    assert (j.healthy, j.removed, j.verdict) == (2, 0, Verdict.PROCEED)


def test_not_ready_and_terminating_replicas_are_not_healthy() -> None:
    reps = (
        *FOUR,
        Replica("new", "n4", frozenset({"gpu0"}), ready=False),
        Replica("old", "n5", frozenset({"gpu0"}), terminating=True),
    )
    j = judge(pool(), PoolState(reps, (hpa(3),), desired=6), DRAIN, now=T0)
    assert (j.healthy, j.verdict) == (3, Verdict.SCALE_UP)


def test_unknown_devices_count_as_removed_by_a_gpu_step() -> None:
    reps = (Replica("a", "n1", None), Replica("b", "n2", frozenset({"gpu0"})))
    evict = Step(StepKind.EVICT_GPU, "n1", faulty=frozenset({"gpu3"}), removes=frozenset({"gpu3"}))
    j = judge(pool(), PoolState(reps, (hpa(2),), desired=2), evict, now=T0)
    assert (j.healthy, j.removed, j.verdict) == (2, 1, Verdict.SCALE_UP)


def test_make_before_break_waits_then_proceeds_then_holds_past_the_timeout() -> None:
    p = pool(ready_timeout_s=600)
    mark = ScaleMark("n1", added=1, original=4, at=T0)
    waiting = PoolState(FOUR, (hpa(3, T0 + 60 * S),), desired=5, mark=mark)
    assert judge(p, waiting, DRAIN, now=T0 + 60 * S).verdict is Verdict.WAIT
    ready = PoolState(FOUR + replicas([("n4", "gpu0")]), (hpa(3, T0 + 90 * S),), 5, mark=mark)
    assert judge(p, ready, DRAIN, now=T0 + 90 * S).verdict is Verdict.PROCEED
    late = PoolState(FOUR, (hpa(3, T0 + 601 * S),), desired=5, mark=mark)
    j = judge(p, late, DRAIN, now=T0 + 601 * S)
    assert (j.verdict, j.hold) == (Verdict.HOLD, HoldReason.NO_ROOM)
    other = PoolState(FOUR, (hpa(3),), desired=5, mark=ScaleMark("n9", 1, 4, T0))
    assert judge(p, other, DRAIN, now=T0).verdict is Verdict.HOLD  # one make-before-break at a time


@pytest.mark.parametrize(
    "reading",
    [hpa(None), hpa(3, at=None), hpa(3, error="ScalingActive=False"), hpa(3, at=T0 - 301 * S)],
)
def test_a_missing_or_stale_signal_holds_and_escalates_after_the_timeout(reading: Demand) -> None:
    p = pool(signal_stale_s=300, escalate_after_s=1800)
    st_ = PoolState(FOUR, (reading,), desired=4)
    j = judge(p, st_, DRAIN, now=T0)
    assert (j.verdict, j.hold, j.escalate) == (Verdict.HOLD, HoldReason.NO_SIGNAL, False)
    assert j.missing and j.demand is None
    later = judge(p, st_, DRAIN, now=T0, held_since=T0 - 1800 * S)
    assert later.escalate and "escalated" in later.reason
    assert judge(pool(on_missing_signal="proceed"), st_, DRAIN, now=T0).verdict is Verdict.PROCEED


def test_every_source_must_answer_and_demand_is_their_maximum() -> None:
    p = pool(demand=[{"kind": "hpa", "name": "llm"}, {"kind": "scale"}])
    both = PoolState(FOUR, (hpa(2), Demand("scale", 3, T0)), desired=4)
    j = judge(p, both, DRAIN, now=T0)
    assert (j.demand, j.verdict) == (3, Verdict.SCALE_UP)
    one = PoolState(FOUR, (hpa(2),), desired=4)
    j = judge(p, one, DRAIN, now=T0)
    assert j.hold is HoldReason.NO_SIGNAL and j.missing == ("scale: not read",)


def test_suspected_corruption_bypasses_even_without_a_signal() -> None:
    sdc = Step(StepKind.DRAIN, "n1", faulty=frozenset({"gpu0"}), bypass="GPU_SDC")
    j = judge(pool(), PoolState(FOUR, (hpa(None),), desired=4), sdc, now=T0)
    assert j.verdict is Verdict.BYPASS and j.goes and "GPU_SDC" in j.reason


def test_restore_waits_for_the_step_to_end_and_for_the_pool_to_keep_demand() -> None:
    mark = ScaleMark("n1", added=1, original=4, at=T0)
    five = FOUR + replicas([("n4", "gpu0")])
    st_ = PoolState(five, (hpa(3),), desired=5, mark=mark)
    assert not restore_due(pool(), st_, now=T0, step_active=True)
    assert restore_due(pool(), st_, now=T0, step_active=False)  # 5 - 1 >= 3
    short = PoolState(FOUR[:3], (hpa(3),), desired=5, mark=mark)
    assert not restore_due(pool(), short, now=T0, step_active=False)
    assert restore_due(pool(), short, now=T0 + 2401 * S, step_active=False)  # given up


def test_combine_goes_only_when_every_pool_lets_it() -> None:
    go = judge(pool(), PoolState(FOUR, (hpa(1),), desired=4), DRAIN, now=T0)
    capped = PoolState(FOUR, (hpa(9),), desired=4, max_replicas=4)
    stop = judge(pool(name="b"), capped, DRAIN, now=T0)
    assert combine([go, stop]) is stop and combine([go]) is go and combine([]) is None


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"pools": [{"name": "a", "namespace": "s", "demand": [{"kind": "hpa", "name": "x"}]}]},
         "pools.0"),
        ({"pools": [{"name": "a", "namespace": "s", "selector": {"app": "a"},
                     "demand": [{"kind": "hpa"}]}]}, "pools.0.demand.0"),
        ({"pools": [{"name": "a", "namespace": "s", "selector": {"app": "a"},
                     "demand": [{"kind": "hpa", "name": "x"}], "headroom": {"pct": 3}}]},
         "pools.0.headroom.pct"),
        ({"pools": [{"name": "a", "namespace": "s", "selector": {"app": "a"}, "demand": []}]},
         "pools.0.demand"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key_and_the_file(data: dict, key: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as e:
        validate(ServingConfig, data, source="gpuvigil.yaml")
    assert e.value.key == key and str(e.value).startswith("gpuvigil.yaml: ")


_reps = st.lists(
    st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.sampled_from(["g0", "g1"]), st.booleans()),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    reps=_reps,
    demand=st.one_of(st.none(), st.integers(0, 12)),
    percent=st.sampled_from([0, 10, 50]),
    extra=st.integers(0, 2),
    cap=st.one_of(st.none(), st.integers(1, 20)),
    spare=st.one_of(st.none(), st.integers(0, 8)),
    whole=st.booleans(),
)
def test_the_gate_never_lets_a_step_take_healthy_below_required(  # type: ignore[no-untyped-def]
    reps, demand, percent, extra, cap, spare, whole
) -> None:
    p = pool(headroom={"percent": percent, "min_extra": extra})
    rs = tuple(Replica(f"r{i}", n, frozenset({g}), ready=ok) for i, (n, g, ok) in enumerate(reps))
    step = Step(StepKind.DRAIN, "n1", faulty=None if whole else frozenset({"g0"}))
    state = PoolState(rs, (hpa(demand),), desired=len(rs), max_replicas=cap, spare_gpus=spare)
    j = judge(p, state, step, now=T0)
    if j.verdict is Verdict.PROCEED and j.removed:
        assert j.healthy - j.removed >= required(demand or 0, p)
    if demand is None and j.removed:
        assert j.verdict is Verdict.HOLD and j.hold is HoldReason.NO_SIGNAL
    if j.verdict is Verdict.SCALE_UP:
        assert j.healthy - j.removed + j.added >= j.required  # type: ignore[operator]
        assert cap is None or j.scale_to <= cap  # type: ignore[operator]
        assert spare is None or j.added <= spare


def test_the_docs_example_loads_and_a_mistake_names_the_file_and_key(tmp_path: Path) -> None:
    from gpuvigil import config

    doc = (Path(__file__).resolve().parents[3] / "docs" / "serving.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    good = tmp_path / "config.yaml"
    good.write_text(example)
    pools = config.load(good).controller.serving.pools
    assert [p.name for p in pools] == ["llm"] and pools[0].headroom.min_extra == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(example.replace("{kind: hpa, name: llm-server}", "{kind: hpa}"))
    with pytest.raises(ConfigError) as e:
        config.load(bad)
    assert str(e.value).startswith(f"{bad}: controller.serving.pools.0.demand.0: ")
