"""The controller under two replicas: the fence before every write, the budget ledger's
compare-and-swap, and the decision memo. In-memory cluster and Lease; the same with real
processes on a real apiserver and real Slurm: tests/integration/controller/test_split_brain.py.
"""

from __future__ import annotations

from datetime import timedelta

from helpers import FATAL

from gpuvigil.platform.budget import BUDGET_ANNOTATION, decode
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller, ControllerConfig
from gpuvigil.platform.leader import LeaderElector
from gpuvigil.platform.policy import PolicyConfig
from gpuvigil.platform.safety import SafetyConfig
from gpuvigil.platform.state import State

# the breaker stays out of it: these small fleets are all faulty on purpose
NO_BREAKER = {
    "max_disrupted_percent": 100,
    "breaker_min_nodes": 10**9,
    "breaker_stale_min_nodes": 10**9,
}
AT_ONCE = PolicyConfig(fatal_grace_s=0)  # a fatal finding drains at once
BUDGET_2 = ControllerConfig(policy=AT_ONCE, safety=SafetyConfig(max_disrupted=2, **NO_BREAKER))


def fleet(n: int = 6, faulty: int = 6) -> MemoryCluster:
    c = MemoryCluster()
    for i in range(n):
        c.add_node(f"n{i}", pods=1, protected_pods=0)
    for i in range(faulty):
        c.set_findings(f"n{i}", [FATAL])
    return c


def in_budget(c: MemoryCluster) -> list[str]:
    return sorted(n for n in c.nodes if (v := c.get_node(n)).record and v.record.in_budget)


def slots(c: MemoryCluster) -> dict[str, str]:
    lease = c.lease.obj
    return decode(lease.annotations.get(BUDGET_ANNOTATION) if lease else None) or {}


def test_two_replicas_on_stale_lists_never_exceed_the_budget() -> None:
    """The issue's case: two controllers acting on slightly different node lists put 4
    nodes into a budget of 2. Here both act (no election at all) and B decides on a node
    list and a ledger read from before A's pass: the ledger's compare-and-swap refuses B."""
    c = fleet()
    a = Controller(c, config=BUDGET_2, clock=c.clock.now, identity="a")
    bc = c.replica()
    b = Controller(bc, config=BUDGET_2, clock=c.clock.now, identity="b")
    stale_nodes, stale_slots = bc.list_nodes(), b.ledger.read()  # type: ignore[union-attr]
    bc.list_nodes = lambda: stale_nodes  # type: ignore[method-assign]
    b.ledger.read = lambda: dict(stale_slots)  # type: ignore[method-assign,union-attr]
    ra = a.reconcile()
    assert sum(d.state is State.DRAINING for d in ra.decisions.values()) == 2
    rb = b.reconcile()
    assert sum(d.disruptive for d in rb.decisions.values()) == 0
    held = [d.held for d in rb.decisions.values() if d.held]
    assert held and all("budget" in h for h in held), held
    assert len(in_budget(c)) == 2 and set(slots(c)) == set(in_budget(c))


def test_slots_are_given_back_after_the_record_leaves_and_reused_in_the_same_pass() -> None:
    c = fleet(n=4, faulty=3)
    one = ControllerConfig(policy=AT_ONCE, safety=SafetyConfig(max_disrupted=1, **NO_BREAKER))
    ctl = Controller(c, config=one, clock=c.clock.now)
    ctl.reconcile()
    (first,) = in_budget(c)
    assert set(slots(c)) == {first}
    for _ in range(40):
        c.advance(30)
        ctl.reconcile()
        if len(ctl.ledger.lease.store.get().annotations) and first not in slots(c):  # type: ignore[union-attr]
            break
    assert first not in slots(c)
    assert len(in_budget(c)) <= 1 and set(slots(c)) == set(in_budget(c))


def test_in_budget_records_are_adopted_and_orphans_dropped_after_the_grace() -> None:
    c = fleet(n=3, faulty=1)
    ctl = Controller(c, config=BUDGET_2, clock=c.clock.now)
    ctl.reconcile()
    assert set(slots(c)) == {"n0"}
    # the annotation is lost (an older version of gpuvigil, a person): adopted again
    ctl.elector.update(lambda ann: {})  # type: ignore[union-attr]
    ctl.reconcile()
    assert set(slots(c)) == {"n0"}
    # a slot whose node is not in the budget (a crash between the two writes) stays
    # until this replica has seen it orphaned for the grace (two lease durations)
    ctl.elector.update(  # type: ignore[union-attr]
        lambda ann: {BUDGET_ANNOTATION: '{"v":1,"slots":{"n0":"default","n2":"default"}}'}
    )
    t = [0.0]
    assert ctl.ledger is not None
    ctl.ledger.mono = lambda: t[0]
    ctl.reconcile()
    assert "n2" in slots(c)
    t[0] = 29
    ctl.reconcile()
    assert "n2" in slots(c)
    t[0] = 31
    ctl.reconcile()
    assert set(slots(c)) == {"n0"}


def test_a_fenced_controller_sends_nothing_and_stops_the_pass() -> None:
    c = fleet(n=4, faulty=4)
    now = [0.0]
    elector = LeaderElector(c.lease_store(), identity="a", monotonic=lambda: now[0])
    ctl = Controller(c, config=BUDGET_2, clock=c.clock.now, elector=elector)
    r = ctl.reconcile()  # not the leader yet: does not even list
    assert not r.listed and r.fenced and not c.calls["list"]
    elector.try_acquire_or_renew()
    asked = 0

    def lapse() -> float:  # asked before the list, then before each write: it lapses
        nonlocal asked  # after the second write (a long pause)
        asked += 1
        if asked > 3:
            now[0] = 10.0
        return elector.fence()

    c.fence = lapse  # type: ignore[method-assign]
    r = ctl.reconcile()
    assert r.fenced and r.errors
    sent = sum(c.calls[op] for op in ("store", "block", "unblock", "drain", "request", "event"))
    assert sent == 2  # the third write found the fence closed, and nothing followed it


def test_the_record_and_the_block_are_one_write() -> None:
    c = fleet(n=1, faulty=1)
    Controller(c, config=BUDGET_2, clock=c.clock.now).reconcile()
    assert c.calls["store"] == 1 and c.calls["block"] == 0
    assert c.get_node("n0").blocked_by_us


def test_unchanged_nodes_reuse_their_decision() -> None:
    c = fleet(n=50, faulty=0)
    ctl = Controller(c, clock=c.clock.now)
    assert ctl.reconcile().decided == 50
    r = ctl.reconcile()  # unchanged: the policy runs again once to look ahead
    assert r.decided == 50
    r = ctl.reconcile()
    assert r.decided == 0 and len(r.decisions) == 50
    c.set_findings("n7", [FATAL])
    r = ctl.reconcile()
    assert r.decided == 1 and r.decisions["n7"].state is not State.HEALTHY
    c.clock.advance(ControllerConfig().recheck_s + 1)
    assert ctl.reconcile().decided == 50  # the look-ahead ran out: decided again


def test_a_memo_never_hides_a_deadline() -> None:
    """A SUSPECT node (non-fatal) whose view never changes (time alone moves) is drained
    within one pass of its grace ending, memo or not."""
    from helpers import NONFATAL

    c = fleet(n=2, faulty=0)
    c.set_findings("n1", [NONFATAL])
    cfg = ControllerConfig(policy=PolicyConfig(heartbeat_stale_s=86400, fatal_grace_s=0))
    ctl = Controller(c, config=cfg, clock=c.clock.now)
    grace = ctl.config.policy.suspect_grace_s
    ctl.reconcile()
    for _ in range(int(grace // 50) + 2):
        c.clock.advance(50)
        if ctl.reconcile().decisions["n1"].state is State.DRAINING:
            break
    assert c.get_node("n1").record.state is State.DRAINING  # type: ignore[union-attr]
    since = c.get_node("n1").record.history[0].at  # type: ignore[union-attr]
    drained = c.get_node("n1").record.since  # type: ignore[union-attr]
    assert drained - since <= timedelta(seconds=grace + 50)
