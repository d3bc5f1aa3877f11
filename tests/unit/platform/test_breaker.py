"""The circuit breaker: a fleet-wide cause is not N hardware faults (table-driven, hypothesis).

Signatures: one finding concentrated on nodes that share an attribute beyond what
independent faults explain trips it (the most specific explanation is named); the findings
it covers neither block nor start a repair; it closes once nobody shows it; held nodes are
probed. Stale: many silent nodes in one pool are the monitoring's failure. Everything else
stays fail closed.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from helpers import CANNOT_RUN, FATAL, NONFATAL, T0, finding, view
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.codes import COULD_NOT_RUN
from gpuvigil.core.findings import Action
from gpuvigil.platform.breaker import Breaker
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.signatures import (
    ANY,
    Signature,
    bursts,
    count,
    min_trip,
    poisson_tail,
)
from gpuvigil.platform.state import Record, State

S = timedelta(seconds=1)
DRIVER = "driver-version"
OTHER_TOOL = finding("DEPENDENCY_MISSING", check="fabric", component="node")


# ---- the test itself --------------------------------------------------------------------


@pytest.mark.parametrize(("k", "lam"), [(1, 0.5), (3, 0.0139), (5, 2.0), (12, 3.3), (40, 40.0)])
def test_poisson_tail_matches_the_textbook_sum(k: int, lam: float) -> None:
    below = sum(math.exp(-lam) * lam**i / math.factorial(i) for i in range(k))
    assert poisson_tail(k, lam) == pytest.approx(1 - below, rel=1e-9, abs=1e-15)
    assert poisson_tail(0, lam) == 1.0 and poisson_tail(10_000, 5.0) == 0.0


def test_thresholds_scale_with_the_group() -> None:
    """The fewest nodes that trip grow with the group: a pool of 64 trips at 3 (the
    minimum), the 512-node fleet at 5, 8,192 nodes at 10, 16,384 at 13."""
    cfg = SafetyConfig()
    trips = [min_trip(n, cfg) for n in (64, 100, 512, 1000, 8192, 16384)]
    assert trips == sorted(trips) and trips[0] == cfg.breaker_min_nodes
    assert (min_trip(512, cfg), min_trip(8192, cfg), min_trip(16384, cfg)) == (5, 10, 13)


def _fleet(size: int, pool_size: int, bad_pool: int, bad: int) -> tuple[dict, dict]:
    attrs = {}
    for i in range(size):
        p = i // pool_size
        driver = "560.1" if p == bad_pool and i % pool_size < bad else "550.5"
        attrs[f"n{i}"] = {"gpuvigil.io/pool": f"p{p}", DRIVER: driver, "zone": f"z{p % 3}"}
    return attrs, {}


def test_the_per_pool_rollout_names_the_driver() -> None:
    """The issue's case: a bad driver on 75 of one 100-node pool in a 1,000-node fleet (7.5%
    of the fleet: the old 10% share cause never tripped). The breaker trips at the third
    node and names the driver version, the smallest group that explains them."""
    attrs, _ = _fleet(1000, 100, bad_pool=4, bad=75)
    sizes = count(attrs.values())
    lost = {("gpu", "GPU_LOST")}
    first3 = {f"n{400 + i}": set(lost) for i in range(3)}
    (b,) = bursts(first3, attrs, sizes, SafetyConfig())
    assert b.signature == Signature("gpu", "GPU_LOST", DRIVER, "560.1")
    assert b.population == 75 and "suspected change driver-version=560.1" in b.describe(600)
    two = dict(list(first3.items())[:2])
    assert bursts(two, attrs, sizes, SafetyConfig()) == []  # two are not yet a pattern


def test_independent_faults_do_not_trip() -> None:
    """30 days of independent faults on 1,000 nodes at 2.6x the Llama 3 rate (0.01 per
    node-day, ten codes, random nodes), judged at every onset over the last window: never
    a trip. The test's bound (0.02 per node-day for one code) is loose on purpose."""
    import random

    rng = random.Random(7)
    attrs, _ = _fleet(1000, 100, bad_pool=-1, bad=0)
    sizes, cfg = count(attrs.values()), SafetyConfig()
    onsets, t = [], 0.0
    while t < 30 * 86400:
        t += rng.expovariate(1000 * 0.01 / 86400)
        onsets.append((t, f"n{rng.randrange(1000)}", ("xid", f"XID_{rng.randrange(10)}")))
    assert len(onsets) > 250
    for i, (t, _, _) in enumerate(onsets):
        new: dict[str, set] = {}  # type: ignore[type-arg]
        for u, node, key in onsets[: i + 1]:
            if t - u <= cfg.breaker_window_s:
                new.setdefault(node, set()).add(key)
        assert bursts(new, attrs, sizes, cfg) == [], (t, new)


def test_many_codes_at_once_trip_the_any_group_only_after_the_codes() -> None:
    attrs, _ = _fleet(200, 100, bad_pool=1, bad=40)
    sizes = count(attrs.values())
    mixed = {f"n{100 + i}": {("xid", f"XID_{i}")} for i in range(8)}
    (b,) = bursts(mixed, attrs, sizes, SafetyConfig())
    assert b.signature.key == ANY and b.signature.attribute == DRIVER
    same = {f"n{100 + i}": {("xid", "XID_79"), ("gpu", "GPU_LOST")} for i in range(8)}
    got = bursts(same, attrs, sizes, SafetyConfig())
    assert {g.signature.code for g in got} == {"XID_79", "GPU_LOST"}  # codes, not "any"


def test_attributes_shared_exactly_are_all_named() -> None:
    attrs = {f"n{i}": {"gpuvigil.io/pool": "a", DRIVER: "2" if i < 10 else "1",
                       "os-image": "new" if i < 10 else "old"} for i in range(100)}  # fmt: skip
    new = {f"n{i}": {("gpu", "GPU_LOST")} for i in range(5)}
    (b,) = bursts(new, attrs, count(attrs.values()), SafetyConfig())
    assert {b.signature.change, *b.also} == {"driver-version=2", "os-image=new"}


# ---- the breaker's memory -----------------------------------------------------------------


def _views(n_bad: int, n: int = 100, *, bad=FATAL, at=T0, driver_bad: str = "2"):  # type: ignore[no-untyped-def]
    out = []
    for i in range(n):
        labels = {DRIVER: driver_bad if i < n_bad else "1"}
        findings = (bad,) if i < n_bad else ()
        out.append(view(*findings, name=f"n{i}", labels=labels, at=at))
    return out


def test_a_signature_opens_holds_and_closes_once_gone() -> None:
    cfg = SafetyConfig(breaker_close_after_s=60)
    b = Breaker(cfg)
    changes = b.update(_views(6), now=T0)
    assert [c.state for c in changes] == ["open"]
    assert changes[0].detail["attribute"] == DRIVER and changes[0].detail["value"] == "2"
    nodes = _views(6)
    assert b.hold_for(nodes[0]).keys == {("xid", "XID_79")}
    assert b.hold_for(nodes[50]).keys == frozenset()
    # a node with the old driver and the same code meanwhile is not held (independent)
    other = view(FATAL, name="n50", labels={DRIVER: "1"})
    assert b.hold_for(other).keys == frozenset()
    assert b.update(_views(0), now=T0 + 10 * S) == [] and b.status.open  # hysteresis
    (closed,) = b.update(_views(0), now=T0 + 71 * S)
    assert closed.state == "closed" and not b.status.open


def test_it_stays_open_while_any_node_still_shows_it() -> None:
    b = Breaker(SafetyConfig(breaker_close_after_s=0))
    b.update(_views(25), now=T0)
    for minute in range(1, 120):  # two hours: no longer new, still there
        now = T0 + minute * 60 * S
        assert b.update(_views(1, at=now), now=now) == []
    assert b.status.open


def test_a_restarted_breaker_retrips_on_what_is_still_shown() -> None:
    b = Breaker(SafetyConfig())
    b.update(_views(10), now=T0)
    later = T0 + 3600 * S
    again = Breaker(SafetyConfig())  # memory lost; the held nodes still show the finding
    assert [c.state for c in again.update(_views(10, at=later), now=later)] == ["open"]
    assert again.hold_for(_views(10, at=later)[0]).keys


def test_nodes_in_an_old_episode_do_not_look_new_after_a_restart() -> None:
    """Episodes older than the level window are neither new nor the level; within it, ten
    of a hundred nodes showing one finding now is a cause however slowly they came."""
    old = Record(state=State.SUSPECT, since=T0 - 30000 * S)
    nodes = [view(FATAL, name=f"n{i}", record=old) for i in range(10)] + [
        view(name=f"h{i}") for i in range(90)
    ]
    assert Breaker(SafetyConfig()).update(nodes, now=T0) == []
    recent = Record(state=State.SUSPECT, since=T0 - 7200 * S)
    nodes[:10] = [view(FATAL, name=f"n{i}", record=recent) for i in range(10)]
    (change,) = Breaker(SafetyConfig()).update(nodes, now=T0)
    assert change.cause == "xid/XID_79@fleet" and "within 21600 s" in change.reason


def test_foreign_blocked_nodes_are_a_persons_and_quarantines_count() -> None:
    """Nodes someone else blocked are not gpuvigil's to judge; nodes gpuvigil quarantined
    are evidence (a burst that quarantines one node at a time must still trip)."""
    q = Record(state=State.QUARANTINED, since=T0)
    foreign = [view(FATAL, name=f"c{i}", blocked_by_others=("cordon",)) for i in range(5)]
    healthy = [view(name=f"h{i}") for i in range(90)]
    assert Breaker(SafetyConfig()).update(foreign + healthy, now=T0) == []
    quarantined = [view(FATAL, name=f"q{i}", record=q) for i in range(5)]
    (change,) = Breaker(SafetyConfig()).update(foreign + quarantined + healthy, now=T0)
    assert change.detail["nodes"] == 5


def test_probes_start_after_a_while_idle_first_and_close_a_cured_signature() -> None:
    cfg = SafetyConfig(breaker_probe_after_s=3600, breaker_probe_interval_s=600)
    b = Breaker(cfg)
    nodes = _views(5)
    nodes[0] = view(FATAL, name="n0", labels={DRIVER: "2"}, running=1)
    b.update(nodes, now=T0)
    b.update(nodes, now=T0 + 3599 * S)
    assert all(not b.hold_for(v).probe for v in nodes)
    b.update(nodes, now=T0 + 3600 * S)
    assert [v.name for v in nodes if b.hold_for(v).probe] == ["n1"]  # idle before busy
    assert b.hold_for(nodes[1]).keys == frozenset()  # the probe is not held
    # the probe's ladder ends with a person: the next probe waits the interval
    q = view(FATAL, name="n1", labels={DRIVER: "2"}, record=Record(state=State.QUARANTINED))
    failed = [nodes[0], q, *nodes[2:]]
    b.update(failed, now=T0 + 4000 * S)
    assert not any(b.hold_for(v).probe for v in failed)
    b.update(failed, now=T0 + 4600 * S)
    assert [v.name for v in failed if b.hold_for(v).probe] == ["n2"]
    # its repair cured it: a repairable fault, not a change; the signature closes
    cured = [*failed[:2], view(name="n2", labels={DRIVER: "2"}), *failed[3:]]
    (closed,) = b.update(cured, now=T0 + 5000 * S)
    assert closed.state == "closed" and "cured n2" in closed.reason and not b.signatures


# ---- stale --------------------------------------------------------------------------------


def _pool(n: int, stale: int, pool: str = "a", *, age_s: float = 400) -> list:  # type: ignore[type-arg]
    return [
        view(name=f"{pool}{i}", labels={"gpuvigil.io/pool": pool},
             at=T0 - (age_s if i < stale else 0) * S)
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("size", "stale", "opens"),
    [(100, 10, True), (100, 9, False), (20, 3, True), (20, 2, False), (1000, 99, False)],
)
def test_stale_opens_per_pool_at_its_share(size: int, stale: int, opens: bool) -> None:
    b = Breaker(SafetyConfig())
    changes = b.update(_pool(size, stale) + _pool(50, 0, "b"), now=T0)
    assert [c.cause for c in changes] == (["stale:a"] if opens else [])
    assert bool(b.hold_for(_pool(size, stale)[0]).stale) is opens
    assert not b.hold_for(_pool(50, 0, "b")[0]).stale  # another pool is not silent


def test_stale_closes_after_the_reports_return() -> None:
    b = Breaker(SafetyConfig(breaker_close_after_s=60))
    b.update(_pool(100, 100), now=T0)
    assert b.update(_pool(100, 4), now=T0 + 10 * S) == []  # below half the threshold
    (closed,) = b.update(_pool(100, 4), now=T0 + 71 * S)
    assert closed.cause == "stale:a" and closed.state == "closed"


def test_never_reported_is_not_silent() -> None:
    nodes = [view(name=f"n{i}", health=None, health_error="absent") for i in range(50)]
    assert Breaker(SafetyConfig()).update(nodes, now=T0) == []


# ---- the whole loop on the in-memory cluster ----------------------------------------------


def _run(
    kinds: list[str], *, passes: int = 3, **safety: object
) -> tuple[MemoryCluster, Controller]:
    c = MemoryCluster()
    per = {"cannot_run": [CANNOT_RUN], "fatal": [FATAL], "both": [CANNOT_RUN, FATAL],
           "nonfatal": [NONFATAL], "other_tool": [OTHER_TOOL]}  # fmt: skip
    for i, kind in enumerate(kinds):
        c.add_node(f"n{i}", pods=1)
        if kind in per:
            c.set_findings(f"n{i}", per[kind], fixed_by=None)
    cfg = ControllerConfig(safety=SafetyConfig(max_disrupted=100, **safety))  # type: ignore[arg-type]
    ctl = Controller(c, config=cfg, clock=c.clock.now)
    for _ in range(passes):
        ctl.reconcile()
        c.advance(60)
    return c, ctl


def blocked(c: MemoryCluster, i: int) -> bool:
    return "unhealthy" in c.nodes[f"n{i}"].our_taints


@pytest.mark.parametrize(
    ("kinds", "hold", "want_open", "want_blocked"),
    [
        # 10 of 100 nodes lose the tool: held, none blocked; the healthy stay in service
        (["cannot_run"] * 10 + ["none"] * 90, True, True, set()),
        # the same without holding blocks: fail closed everywhere (the strict setting)
        (["cannot_run"] * 10 + ["none"] * 90, False, True, set(range(10))),
        # two: not a pattern, still blocked, breaker closed
        (["cannot_run"] * 2 + ["none"] * 98, True, False, {0, 1}),
        # a real fault during the tool storm is blocked; so is a node with both
        (["cannot_run"] * 8 + ["fatal", "both"] + ["none"] * 90, True, True, {8, 9}),
        # another check failing closed on one node is not explained by the storm
        (["cannot_run"] * 8 + ["other_tool"] + ["none"] * 91, True, True, {8}),
    ],
)
def test_a_signature_holds_only_its_own_blocks(kinds, hold, want_open, want_blocked) -> None:  # type: ignore[no-untyped-def]
    c, ctl = _run(kinds, breaker_hold_blocks=hold)
    assert ctl.breaker.status.open is want_open
    assert {i for i in range(len(kinds)) if blocked(c, i)} == want_blocked


def test_a_real_fault_gets_the_ladder_while_a_signature_holds() -> None:
    c, ctl = _run(["cannot_run"] * 10 + ["fatal"] + ["none"] * 89, passes=5)
    assert ctl.breaker.status.open
    assert [a[0] for a in c.nodes["n10"].actions][:2] == ["block", "drain"]


def test_a_bad_driver_burst_is_held_before_any_drain() -> None:
    """25 of 100 nodes read lost GPUs at once (fatal findings): the breaker trips in the
    pass that sees the third, before any fatal grace ends, so nothing is drained. A held
    fatal finding still blocks (the breaker holds remediation, never detection); the
    healthy nodes stay in service; when the rollback lands every block is lifted and the
    breaker closes with hysteresis."""
    c, ctl = _run(["fatal"] * 25 + ["none"] * 75, passes=120)  # two hours
    assert ctl.breaker.status.open
    assert not any(a[0] in ("drain", "request") for n in c.nodes.values() for a in n.actions)
    assert all(blocked(c, i) for i in range(25))
    assert not any(blocked(c, i) for i in range(25, 100))
    for i in range(25):
        c.clear_findings(f"n{i}")
    for _ in range(17):
        ctl.reconcile()
        c.advance(60)
    assert not ctl.breaker.status.open
    assert not any(blocked(c, i) for i in range(100))


kinds = st.sampled_from(["none", "none", "cannot_run", "fatal", "nonfatal", "both"])


@settings(max_examples=30, deadline=None)
@given(kinds=st.lists(kinds, min_size=5, max_size=40), hold=st.booleans())
def test_breaker_blocks_exactly_what_it_should(kinds, hold) -> None:  # type: ignore[no-untyped-def]
    """Whatever the mix: a healthy node is never blocked; a node whose findings a signature
    holds is not blocked (unless holding is off, or a held finding says the machine is
    broken: any but a check that could not run) and never
    disrupted; a node with a finding
    no signature holds is blocked or under repair."""
    c, ctl = _run(kinds, breaker_hold_blocks=hold)
    for i, kind in enumerate(kinds):
        v = ctl.cluster.get_node(f"n{i}")
        held = ctl.breaker.hold_for(v).keys
        shown = {(f.check, f.code) for f in (v.health.findings if v.health else [])}
        if kind == "none":
            assert not blocked(c, i)
        elif shown <= held:
            severe = any(f.fatal or f.code not in COULD_NOT_RUN  # a broken machine's
                         for f in v.health.findings)  # type: ignore[union-attr]  # fmt: skip
            assert blocked(c, i) is (severe or not hold)
            assert not [a for a in c.nodes[f"n{i}"].actions if a[0] in ("drain", "request")]
        else:
            rec = v.record
            assert rec is not None and rec.state is not State.HEALTHY
            assert blocked(c, i) or rec.state is State.REMEDIATING


def test_held_nodes_are_probed_and_a_cause_a_reboot_cures_closes() -> None:
    """Five nodes' GPU query hangs at once (a driver bug a reboot clears): the breaker holds
    it. An hour later one held node is probed: reset (no cure), reboot (cured); so the
    signature is a repairable fault, it closes, and the others walk the ladder within
    budget until every node is back. The breaker does not stay open for weeks."""
    c = MemoryCluster()
    hung = finding("CHECK_TIMEOUT", action=Action.NONE, component="gpu:0", check="gpu")
    for i in range(20):
        c.add_node(f"n{i}")
    for i in range(5):
        c.set_findings(f"n{i}", [hung], fixed_by=Action.REBOOT)
    safety = SafetyConfig(breaker_probe_after_s=3600, breaker_close_after_s=300)
    ctl = Controller(c, config=ControllerConfig(safety=safety), clock=c.clock.now)
    ctl.reconcile()
    assert ctl.breaker.status.causes == ["gpu/CHECK_TIMEOUT@fleet"]
    probed = set()
    for _ in range(6 * 60):  # six hours, a pass a minute
        c.advance(60)
        ctl.reconcile()
        probed |= {s.probe for s in ctl.breaker.signatures.values() if s.probe}
        recs = [c.get_node(f"n{i}").record for i in range(5)]
        if not ctl.breaker.status.open and all(r and r.state is State.HEALTHY for r in recs):
            break
    assert probed == {"n0"}  # one probe, the first idle node
    assert not ctl.breaker.status.open
    for i in range(5):
        v = c.get_node(f"n{i}")
        assert not c.nodes[f"n{i}"].faults and v.record is not None
        assert v.record.state is State.HEALTHY and v.record.step is Action.REBOOT
    assert not c.replaced and all(a[1].split()[0] != "REPLACE" for n in c.nodes.values()
                                  for a in n.actions if a[0] == "request")  # fmt: skip
