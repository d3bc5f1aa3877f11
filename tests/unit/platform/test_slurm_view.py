"""Slurm node JSON (as `sinfo --json` 22.05 prints it) -> NodeView, without Slurm."""

from __future__ import annotations

from helpers import FATAL, T0

from gpuvigil.core.wire import HealthSummary
from gpuvigil.platform.clusters.slurm import expand_hostlist, view
from gpuvigil.platform.state import Record, State

BASE = {
    "name": "gpu4",
    "state": "idle",
    "state_flags": [],
    "reason": "",
    "comment": "",
    "extra": "",
    "boot_time": 1796023846,
    "reason_changed_at": 0,
    "partitions": ["gpu"],
}


def node(**kw: object) -> dict[str, object]:
    return {**BASE, **kw}


def test_foreign_drain_and_our_drain() -> None:
    v = view(node(state_flags=["DRAIN"], reason="bad fan"))
    assert not v.blocked_by_us and v.blocked_by_others == ("slurm:drain:bad fan",)
    v = view(node(state_flags=["DRAIN"], reason="gpuvigil:SUSPECT:-:XID_79"))
    assert v.blocked_by_us and not v.blocked_by_others
    assert v.labels == {"gpuvigil.io/pool": "gpu"} and not v.preflight_supported


def test_pool_is_the_first_partition_under_the_configured_label() -> None:
    v = view(node(partitions=["llm", "debug"]), pool_label="example.com/gpu-pool")
    assert (v.pool, v.labels) == ("llm", {"example.com/gpu-pool": "llm"})
    assert view(node(partitions=[])).pool == "default"


def test_record_from_comment_else_from_reason() -> None:
    rec = Record(state=State.DRAINING, since=T0, code="XID_79")
    v = view(node(state_flags=["DRAIN"], reason=rec.tag(), comment=rec.encode()))
    assert v.record == rec
    v = view(
        node(
            state_flags=["DRAIN"],
            reason="gpuvigil:REMEDIATING:REBOOT:XID_79 : reboot issued",
            comment="garbage{",
            reason_changed_at=1796025393,
        )
    )
    assert v.record is not None and v.record.state is State.REMEDIATING


def test_reboot_result_from_flags_and_boot_time() -> None:
    rec = Record(state=State.REMEDIATING, since=T0, request_id="r1")
    pending = view(
        node(
            state="down",
            state_flags=["DRAIN", "REBOOT_ISSUED"],
            reason=rec.tag(),
            comment=rec.encode(),
            boot_time=int(T0.timestamp()) - 5,
        )
    )
    assert pending.agent_result is None
    done = view(
        node(
            state_flags=["DRAIN"],
            reason=rec.tag(),
            comment=rec.encode(),
            boot_time=int(T0.timestamp()) + 60,
        )
    )
    assert done.agent_result is not None and done.agent_result.succeeded
    failed = view(
        node(state="down", state_flags=["DRAIN"], reason="reboot timed out", comment=rec.encode())
    )
    assert failed.agent_result is not None and not failed.agent_result.succeeded


def test_health_from_extra() -> None:
    summary = HealthSummary(generated_at=T0, status="FAILED", findings=[FATAL])
    v = view(node(extra=summary.model_dump_json()))
    assert v.health == summary and v.heartbeat_at == T0
    assert view(node(extra="{oops")).health_error == "unreadable"


def test_hostlist_never_raises_on_garbage() -> None:
    for text in ["", "[", "]", "a[1-", "a[x-y]", ",,", "a[3-1]"]:
        expand_hostlist(text)


def test_the_agents_standalone_drain_is_gpuvigils_block() -> None:
    """One drain policy: the agent's standalone drain carries the controller's tag for a
    blocked node, so a controller knows it for gpuvigil's (and takes it from there)."""
    from gpuvigil.core.findings import Action, Finding, Status
    from gpuvigil.node.sinks.slurm import drain_reason

    f = Finding(check="xid", status=Status.FAILED, code="XID_79", component="gpu:3",
                message="", action=Action.REBOOT, fatal=True)  # fmt: skip
    v = view(node(state_flags=["DRAIN"], reason=drain_reason(f)))
    assert v.blocked_by_us and not v.blocked_by_others
    assert v.record is not None and v.record.state.value == "SUSPECT"
    old = view(node(state_flags=["DRAIN"], reason="gpuvigil: XID_79 gpu:3"))  # before: foreign
    assert not old.blocked_by_us and old.blocked_by_others


def test_features_and_kernel_are_attributes_for_the_breaker() -> None:
    raw = node(
        active_features="h100,ib,driver=560.35",
        operating_system="Linux 5.15.0-91-generic #101-Ubuntu SMP Tue Nov 14 13:30:08 UTC 2023",
        slurmd_version="22.05.8",
    )
    v = view(raw)
    assert v.attributes == {
        "features": "driver=560.35,h100,ib",
        "driver": "560.35",
        "kernel-version": "5.15.0-91-generic",
        "slurmd-version": "22.05.8",
    }
    assert view(node(features=["b", "a"])).attributes == {"features": "a,b"}  # newer: a list


def test_replace_is_supported_only_with_a_hook() -> None:
    assert not view(node()).replace_supported
    assert view(node(), replace_supported=True).replace_supported
