"""The real controller's event log (policy, safety, virtual-time MemoryCluster) through the
SLO and attribution code: what the controller writes is what the report reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuvigil.core.events import EventWriter
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.observe import events as reader
from gpuvigil.observe import summary

platform = pytest.importorskip("gpuvigil.platform.clusters.memory")
controller = pytest.importorskip("gpuvigil.platform.controller")

XID79 = FindingSummary(code="XID_79", component="gpu:3", status=Status.FAILED,
                       action=Action.RESET_GPU, fatal=True, check="xid")  # fmt: skip


def _run(tmp_path: Path, *, fixed_by: Action | None) -> tuple[Path, list[dict]]:
    log = tmp_path / "events.jsonl"
    cluster = platform.MemoryCluster()
    for i in range(4):
        cluster.add_node(f"n{i}", pods=1)
    with EventWriter(log) as w:
        ctl = controller.Controller(cluster, clock=cluster.clock.now, events=w)
        ctl.reconcile()
        cluster.advance(600)
        ctl.reconcile()
        cluster.set_findings("n1", [XID79], fixed_by=fixed_by)
        for _ in range(60):  # 30 virtual minutes
            cluster.advance(30)
            ctl.reconcile()
    every = [json.loads(x) for x in log.read_text().splitlines()]
    # The controller first puts every node's state on record (`from: null`); the rest are
    # the transitions and remediations this test is about.
    announced = [x for x in every if x["kind"] == "node.state" and x["data"]["from"] is None]
    assert sorted(x["node"] for x in announced) == [f"n{i}" for i in range(4)]
    return log, [x for x in every if x not in announced]


def test_a_fatal_xid_drained_reset_and_returned(tmp_path: Path) -> None:
    log, lines = _run(tmp_path, fixed_by=Action.RESET_GPU)
    states = [x["data"]["to"] for x in lines if x["kind"] == "node.state"]
    # blocked at once, drained `fatal_grace_s` later (a burst is judged before it is admitted)
    assert states[:2] == ["SUSPECT", "DRAINING"] and states[-1] == "HEALTHY"
    s = summary.summarize(reader.read_events([log]))
    r = s.slo
    assert (r.drains, r.false_positive_drains, r.cordons) == (1, 0, 0)
    back = next(
        x["ts"] for x in lines if x["kind"] == "node.state" and x["data"]["to"] == "HEALTHY"
    )
    assert r.mttr.samples == [back - lines[0]["ts"]]
    assert s.top_nodes()[0]["node"] == "n1"


def test_an_unfixable_fault_escalates_to_replace_and_counts_as_repaired(tmp_path: Path) -> None:
    log, lines = _run(tmp_path, fixed_by=None)
    actions = [x["data"]["action"] for x in lines
               if x["kind"] == "remediation" and x["data"]["result"] == "started"]  # fmt: skip
    assert actions == ["DRAIN", "RESET_GPU", "REBOOT", "REPLACE"]
    s = summary.summarize(reader.read_events([log]))
    r = s.slo
    assert (r.drains, r.false_positive_drains) == (1, 0)
    back = [x["ts"] for x in lines if x["kind"] == "node.state" and x["data"]["to"] == "HEALTHY"]
    assert r.mttr.samples == [back[-1] - lines[0]["ts"]]  # until the replacement validated
    # Every node is on record from the start: three stayed in service, n1 did not for a while.
    assert 0.75 < s.slo.to_json()["availability"]["achieved"] < 1.0


def test_a_drain_carries_its_findings_and_attribution_reads_only_them(tmp_path: Path) -> None:
    """The controller's moves name the findings behind them (`codes`, `components`, beside
    the words of `reason`); attribution charges a drain by those fields alone: rewriting the
    words changes nothing, and a move without the fields (an old log's) charges nothing."""
    from gpuvigil.core.events import Event
    from gpuvigil.observe import attribution

    _, lines = _run(tmp_path, fixed_by=Action.RESET_GPU)
    drain = next(x for x in lines if x["kind"] == "node.state" and x["data"]["to"] == "DRAINING")
    assert (drain["data"]["codes"], drain["data"]["components"]) == (["XID_79"], ["gpu:3"])
    healthy = [x for x in lines if x["kind"] == "node.state" and x["data"]["to"] == "HEALTHY"]
    assert healthy[-1]["data"]["codes"] == []  # nothing wrong: no finding explains it
    t = drain["ts"]
    start = Event(ts=t - 60, kind="job.start", source="t", job="j", data={"nodes": ["n1"]})
    restart = Event(ts=t + 5, kind="job.restart", source="t", job="j",
                    data={"node": "n1", "exit_code": 137, "cause": "unknown"})  # fmt: skip

    def attribute(data: dict) -> attribution.Attribution:
        moved = Event(ts=t, kind="node.state", source="controller", node="n1", data=data)
        return attribution.attribute([start, moved, restart]).attributions[0]

    got = attribute(drain["data"])
    assert (got.cause, got.code, got.component) == ("hardware", "XID_79", "gpu:3")
    lying = {**drain["data"], "reason": "persisted: CHECK_TIMEOUT on node"}
    assert attribute(lying).cause == "hardware"
    old = {k: v for k, v in drain["data"].items() if k not in ("codes", "components")}
    assert attribute(old).cause == "unknown"
