"""A replacement that deletes the node says so: `node.state` to REMOVED (`core.states`), so
layer 4 stops counting a machine that left the fleet; one that keeps it says nothing."""

from __future__ import annotations

import json

from helpers import REPLACE

from gpuvigil.core.events import EventWriter
from gpuvigil.core.states import REMOVED
from gpuvigil.platform.clusters.memory import MemoryCluster
from gpuvigil.platform.controller import Controller


class DeletingCluster(MemoryCluster):
    replace_removes_node = True


def states(path) -> list[str]:  # type: ignore[no-untyped-def]
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [x["data"]["to"] for x in lines if x["kind"] == "node.state"]


def run(cluster: MemoryCluster, tmp_path) -> list[str]:  # type: ignore[no-untyped-def]
    for name in ("n0", "n1", "n2"):
        cluster.add_node(name)
    cluster.set_findings("n1", [REPLACE])
    events = EventWriter(tmp_path / "ev.jsonl")
    ctl = Controller(cluster, clock=cluster.clock.now, events=events)
    for _ in range(60):  # 10 min: past any grace a fatal finding gets before its drain
        ctl.reconcile()
        cluster.clock.advance(10)
    events.close()
    return states(tmp_path / "ev.jsonl")


def test_a_deleted_node_is_reported_removed_and_leaves_availability(tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = run(DeletingCluster(replace_adds_node=False), tmp_path)
    assert got.count(REMOVED) == 1 and got.index(REMOVED) > got.index("REMEDIATING")


def test_a_kept_node_is_not_reported_removed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = run(MemoryCluster(), tmp_path)
    assert "REMEDIATING" in got and REMOVED not in got
