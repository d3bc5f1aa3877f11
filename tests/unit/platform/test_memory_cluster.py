"""The in-memory cluster keeps the semantics the controller relies on."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.clusters.base import Cluster, Conflict, Forbidden, Record, Unavailable
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.state import State

XID79 = FindingSummary(
    code="XID_79", component="gpu:3", status=Status.FAILED, action=Action.RESET_GPU, fatal=True
)


def test_is_a_cluster() -> None:
    assert isinstance(MemoryCluster(), Cluster)


def test_blocks_are_ours_or_someone_elses() -> None:
    c = MemoryCluster()
    c.add_node("n1")
    c.cordon("n1")
    c.block("n1", reason="x")
    c.unblock("n1")
    v = c.get_node("n1")
    assert not v.blocked_by_us
    assert v.blocked_by_others == ("cordon",)


def test_store_is_optimistic() -> None:
    c = MemoryCluster()
    c.add_node("n1")
    v = c.get_node("n1")
    c.store("n1", Record(state=State.SUSPECT), version=v.version)
    with pytest.raises(Conflict):
        c.store("n1", Record(state=State.HEALTHY), version=v.version)
    assert c.get_node("n1").record.state is State.SUSPECT


def test_agent_answers_once_per_id_and_reboot_changes_boot_id() -> None:
    c = MemoryCluster()
    c.add_node("n1")
    c.set_findings("n1", [XID79], fixed_by=Action.REBOOT)
    c.request("n1", action=Action.REBOOT, request_id="r1", gpus=[])
    c.request("n1", action=Action.REBOOT, request_id="r1", gpus=[])
    assert c.calls["request"] == 2
    assert [a for a in c.nodes["n1"].actions if a[0] == "request"] == [("request", "REBOOT r1")]
    c.advance(c.reboot_s)
    v = c.get_node("n1")
    assert v.agent_result is not None and v.agent_result.request_id == "r1"
    assert v.boot_id == "boot-1"
    assert v.health is not None and v.health.status is Status.OK


def test_pdb_protected_pods_wait_for_the_deadline() -> None:
    c = MemoryCluster()
    c.add_node("n1", pods=2, protected_pods=1)
    deadline = c.clock.now() + timedelta(seconds=60)
    st = c.drain("n1", deadline=deadline, reason="x")
    assert (st.remaining, st.blocked) == (1, 1)
    c.advance(60)
    st = c.drain("n1", deadline=deadline, reason="x")
    assert st.done and st.forced == 1
    assert all(p.disruption_target for p in c.nodes["n1"].evicted)


def test_injected_errors() -> None:
    c = MemoryCluster()
    c.add_node("n1")
    c.fail_next("list", Unavailable)
    with pytest.raises(Unavailable):
        c.list_nodes()
    assert len(c.list_nodes()) == 1
    with pytest.raises(Forbidden):
        c.get_node("nope")


def test_garbage_summary_is_unreadable_not_healthy() -> None:
    c = MemoryCluster()
    c.add_node("n1")
    c.set_health_raw("n1", "{not json")
    v = c.get_node("n1")
    assert v.health is None and v.health_error == "unreadable"
