"""The cluster interface's contract (`platform.clusters.base.Cluster`), one set of tests run
against all three implementations: the in-memory cluster (the simulator's and the unit
tests'), Kubernetes on a real kube-apiserver and Slurm on real Slurm 22.05. A promise one
adapter breaks shows here as that adapter's failure (on main, `SlurmCluster.store` ignored
`version`: the stale-version test failed for Slurm alone).

Each world gives the adapter and a way to play the rest of the cluster (the agent
publishing, a person blocking a node, work running)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest
from ctl_helpers import FATAL, Agent, health

from gpuvigil.core.findings import Action
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform.clusters.base import Conflict, Fenced, Forbidden, Record, State

pytestmark = pytest.mark.realparts


class World(Protocol):
    cluster: Any
    nodes: list[str]  # at least two, healthy, unblocked, idle

    def publish(self, node: str, *findings: FindingSummary) -> None: ...
    def publish_raw(self, node: str, text: str) -> None: ...
    def foreign_block(self, node: str) -> None: ...
    def cleanup(self) -> None: ...


class MemoryWorld:
    def __init__(self) -> None:
        from gpuvigil.platform.clusters.memory import MemoryCluster

        self.cluster = MemoryCluster()
        self.nodes = ["m1", "m2"]
        for n in self.nodes:
            self.cluster.add_node(n)

    def publish(self, node: str, *findings: FindingSummary) -> None:
        self.cluster.set_findings(node, list(findings))

    def publish_raw(self, node: str, text: str) -> None:
        self.cluster.set_health_raw(node, text)

    def foreign_block(self, node: str) -> None:
        self.cluster.cordon(node)

    def cleanup(self) -> None:
        pass


class KubeWorld:
    def __init__(self, kube: Any) -> None:
        from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
        from gpuvigil.platform.clusters.settings import KubernetesSettings

        self.kube, self.agent = kube, Agent(kube.core(), kube)
        kube.ensure_namespace("gpuvigil")  # where the controller keeps its signing key
        tag = uuid.uuid4().hex[:6]
        self.nodes = [kube.create_node(f"k-{tag}-{i}", labels={"fleet": tag}) for i in range(2)]
        settings = KubernetesSettings(
            node_selector=f"fleet={tag}",
            lease_namespace=kube.namespace("lease"),
            watch=False,
            pool_gpus={"default": 8},  # what preflight validates: the pool's count
        )
        self.cluster = KubernetesCluster(settings, api_client=kube.api_client())
        for n in self.nodes:
            self.publish(n)

    def publish(self, node: str, *findings: FindingSummary) -> None:
        self.agent.publish(node, *findings)

    def publish_raw(self, node: str, text: str) -> None:
        from gpuvigil.core import wire

        self.kube.core().patch_node(
            node, {"metadata": {"annotations": {wire.HEALTH_ANNOTATION: text}}}
        )

    def foreign_block(self, node: str) -> None:
        self.kube.kubectl("cordon", node)

    def cleanup(self) -> None:
        self.cluster.close()


class SlurmWorld:
    def __init__(self, slurm: Any, tmp: Path) -> None:
        from gpuvigil.platform.clusters.settings import SlurmSettings
        from gpuvigil.platform.clusters.slurm import SlurmCluster

        self.slurm = slurm
        self.nodes = slurm.names[:2]
        self.cluster = SlurmCluster(
            SlurmSettings(conf=str(slurm.conf), lease_dir=str(tmp / "lease"))
        )
        for n in slurm.names:
            self.publish(n)

    def publish(self, node: str, *findings: FindingSummary) -> None:
        self.publish_raw(node, health(*findings))

    def publish_raw(self, node: str, text: str) -> None:
        self.slurm.run("scontrol", "update", f"NodeName={node}", f"Extra={text}")

    def foreign_block(self, node: str) -> None:
        self.slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=bios")

    def cleanup(self) -> None:
        for n in self.slurm.names:  # leave no record or reboot behind for the next test
            self.slurm.run("scontrol", "cancel_reboot", n, check=False)
            self.slurm.run("scontrol", "update", f"NodeName={n}", "Comment=", check=False)


@pytest.fixture(params=["memory", "kubernetes", "slurm"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    w: World
    if request.param == "memory":
        w = MemoryWorld()
    elif request.param == "kubernetes":
        w = KubeWorld(request.getfixturevalue("kube"))
    else:
        w = SlurmWorld(request.getfixturevalue("slurm"), tmp_path)
    try:
        yield w
    finally:
        w.cleanup()


def rec(state: State = State.SUSPECT, **kw: Any) -> Record:
    return Record(state=state, since=datetime.now(UTC), reason="contract", code="XID_79", **kw)


# ---- reading ----------------------------------------------------------------------------


def test_lists_every_node_with_its_decoded_summary(world: World) -> None:
    world.publish(world.nodes[0], FATAL)
    views = {v.name: v for v in world.cluster.list_nodes()}
    assert set(world.nodes) <= set(views)
    bad, good = views[world.nodes[0]], views[world.nodes[1]]
    assert bad.health is not None and [f.code for f in bad.health.findings] == ["XID_79"]
    assert good.health is not None and good.health.findings == [] and good.health_error is None
    assert bad.heartbeat_at is not None and bad.record is None and not bad.blocked_by_us
    assert (bad.version and bad.version != good.version) or bad.version != ""


def test_an_unreadable_summary_is_unknown_never_healthy(world: World) -> None:
    world.publish_raw(world.nodes[0], "{garbage")
    v = world.cluster.get_node(world.nodes[0])
    assert v.health is None and v.health_error == "unreadable" and v.heartbeat_at is None


def test_an_unknown_node_is_forbidden(world: World) -> None:
    with pytest.raises(Forbidden):
        world.cluster.get_node("no-such-node")


# ---- the record --------------------------------------------------------------------------


def test_store_round_trips_and_honours_the_version(world: World) -> None:
    c, node = world.cluster, world.nodes[0]
    v = c.get_node(node)
    c.store(node, rec(), version=v.version)
    after = c.get_node(node)
    assert after.record is not None and after.record.state is State.SUSPECT
    assert after.version != v.version  # a write changes the version
    world.publish(node, FATAL)  # the agent writes meanwhile (a heartbeat)
    with pytest.raises(Conflict):
        c.store(node, rec(State.DRAINING), version=after.version)
    fresh = c.get_node(node)
    assert fresh.record is not None and fresh.record.state is State.SUSPECT  # nothing lost
    c.store(node, rec(State.DRAINING), version=fresh.version)
    assert c.get_node(node).record.state is State.DRAINING  # type: ignore[union-attr]


def test_store_with_block_is_the_record_and_the_block(world: World) -> None:
    c, node = world.cluster, world.nodes[0]
    c.store(node, rec(), version=c.get_node(node).version, block=True)
    v = c.get_node(node)
    assert v.blocked_by_us and v.record is not None and v.record.state is State.SUSPECT


# ---- blocks ------------------------------------------------------------------------------


def test_block_and_unblock_are_idempotent_and_ours_only(world: World) -> None:
    c, mine, theirs = world.cluster, world.nodes[0], world.nodes[1]
    c.store(mine, rec(), block=True)
    c.block(mine, reason=rec().tag())
    c.block(mine, reason=rec().tag())
    assert c.get_node(mine).blocked_by_us
    c.unblock(mine)
    c.unblock(mine)
    assert not c.get_node(mine).blocked_by_us
    world.foreign_block(theirs)
    c.unblock(theirs)
    v = c.get_node(theirs)
    assert v.blocked_by_someone_else and not v.blocked_by_us  # never lifted


# ---- work and requests -------------------------------------------------------------------


def test_draining_an_idle_node_is_done(world: World) -> None:
    node = world.nodes[0]
    world.cluster.store(node, rec(State.DRAINING), block=True)
    st = world.cluster.drain(node, deadline=datetime.now(UTC) + timedelta(hours=1), reason="t")
    assert st.done and st.forced == 0


def test_requests_are_resets_or_reboots_once_per_id(world: World) -> None:
    c, node = world.cluster, world.nodes[0]
    c.store(node, rec(State.REMEDIATING, step=Action.REBOOT, request_id="r1"), block=True)
    c.request(node, action=Action.REBOOT, request_id="r1", gpus=[3])
    c.request(node, action=Action.REBOOT, request_id="r1", gpus=[3])  # a resend: no effect
    with pytest.raises(Forbidden):
        c.request(node, action=Action.REPLACE, request_id="r2", gpus=[])


def test_events_and_release_marks_never_fail(world: World) -> None:
    c, node = world.cluster, world.nodes[0]
    c.record_event(node, reason="gpuvigilSuspect", message="contract", warning=True)
    c.mark_released(node, at=datetime.now(UTC))
    assert c.revalidate(node, since=datetime.now(UTC)) >= 0


# ---- fencing and the lease -----------------------------------------------------------------


def test_a_fenced_adapter_sends_no_write(world: World) -> None:
    c, node = world.cluster, world.nodes[0]
    before = c.get_node(node)

    def closed() -> float:
        raise Fenced("not the leader")

    c.fence = closed
    try:
        for write in (
            lambda: c.store(node, rec(), block=True),
            lambda: c.block(node, reason="x"),
            lambda: c.request(node, action=Action.REBOOT, request_id="f1", gpus=[]),
            lambda: c.replace(node, reason="x"),
        ):
            with pytest.raises((Fenced, Forbidden)):  # Forbidden: no replace channel at all
                write()
    finally:
        del c.fence  # back to the class's: unfenced
    after = c.get_node(node)
    assert after.record == before.record and after.blocked_by_us == before.blocked_by_us


def test_the_lease_is_compare_and_swap(world: World) -> None:
    store = world.cluster.lease_store()
    assert store.get() is None
    first = store.create({"holderIdentity": "a"}, {"k": "1"})
    with pytest.raises(Conflict):
        store.create({"holderIdentity": "b"}, {})
    second = store.replace({"holderIdentity": "a"}, {"k": "2"}, version=first.version)
    with pytest.raises(Conflict):
        store.replace({"holderIdentity": "b"}, {}, version=first.version)
    got = store.get()
    assert got is not None and got.version == second.version
    assert got.spec["holderIdentity"] == "a" and got.annotations == {"k": "2"}
