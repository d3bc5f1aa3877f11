"""The Kubernetes adapter's node watch (`clusters.k8s_watch`) on a real kube-apiserver: one
LIST, then events; an API server that stops answering makes the picture stale, and a stale
picture is acted on by nobody (Unavailable) until the watch hears something again.

(410 Gone is tested in tests/unit/platform/test_node_watch.py: 1.20's watch cache sizes
itself to keep the last ~75 s of events, so a real 410 takes minutes of churn or a second
API server with its cache off.)"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from ctl_helpers import FATAL, Agent, wait_for

from gpuvigil.platform.clusters.base import Unavailable

pytestmark = pytest.mark.realparts


@pytest.fixture
def watched(kube: Any) -> Iterator[tuple[Any, list[str], Agent]]:
    from gpuvigil.platform.clusters.kubernetes import KubernetesCluster
    from gpuvigil.platform.clusters.settings import KubernetesSettings

    tag = uuid.uuid4().hex[:6]
    nodes = [kube.create_node(f"w-{tag}-{i}", labels={"fleet": tag}) for i in range(3)]
    agent = Agent(kube.core())
    for n in nodes:
        agent.publish(n)
    settings = KubernetesSettings(
        node_selector=f"fleet={tag}", watch_timeout_s=20, watch_stale_s=3,
        lease_namespace=kube.namespace("lease"),
    )  # fmt: skip
    c = KubernetesCluster(settings, api_client=kube.api_client())
    try:
        yield c, nodes, agent
    finally:
        c.close()


def codes(c: Any, node: str) -> list[str]:
    v = next(v for v in c.list_nodes() if v.name == node)
    return [f.code for f in v.health.findings] if v.health else []


def test_one_list_then_events(watched) -> None:  # type: ignore[no-untyped-def]
    c, nodes, agent = watched
    assert {v.name for v in c.list_nodes()} == set(nodes)
    lists = c.calls["list_nodes"]
    agent.publish(nodes[1], FATAL)
    wait_for(lambda: codes(c, nodes[1]) == ["XID_79"], 30, "the change to arrive by the watch")
    for _ in range(5):
        c.list_nodes()
    assert c.calls["list_nodes"] == lists  # no LIST per pass
    assert c.watch_age_s() < 3
    first = next(v for v in c.list_nodes() if v.name == nodes[0])
    assert next(v for v in c.list_nodes() if v.name == nodes[0]) is first  # unchanged: reused


def test_a_silent_api_server_makes_the_picture_stale_and_unusable(kube, watched) -> None:  # type: ignore[no-untyped-def]
    c, nodes, agent = watched
    c.list_nodes()
    wait_for(lambda: c.watch._resp is not None, 30, "the watch to be open")
    apiserver = kube.cp.procs["kube-apiserver"].pid
    os.kill(apiserver, signal.SIGSTOP)  # hung: connections stay open, nothing comes
    try:
        wait_for(lambda: c.watch_age_s() > 3, 30, "the watch to notice the silence")
        with pytest.raises(Unavailable, match="heard nothing"):
            c.list_nodes()
    finally:
        os.kill(apiserver, signal.SIGCONT)
    agent.publish(nodes[0], FATAL)

    def usable() -> bool:
        try:
            return codes(c, nodes[0]) == ["XID_79"]
        except Unavailable:
            return False

    wait_for(usable, 60, "the watch to hear the API server again")
