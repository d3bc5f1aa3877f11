"""Slurm's side of per-GPU isolation, without Slurm: no per-GPU reset (the GPU is isolated
once nobody holds it), and a degraded-node drain is neither the node ladder's nor foreign."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuvigil.core.findings import Action, Status
from gpuvigil.core.wire import FindingSummary
from gpuvigil.platform import isolation as iso
from gpuvigil.platform.clusters.slurm import view

T0 = datetime(2026, 12, 1, tzinfo=UTC)
BAD = FindingSummary(code="XID_94", component="gpu:3", status=Status.FAILED,
                     action=Action.RESET_GPU, check="xid", uuid="GPU-3")  # fmt: skip


def test_without_a_per_gpu_reset_the_gpu_is_isolated_once_nobody_holds_it() -> None:
    kw = {"node": "gpu2", "local": iso.gpu_local_codes(), "enforced": True,
          "uuids": {3: "GPU-3"}, "scope_kind": "slurm", "reset_supported": False}  # fmt: skip
    d = iso.decide_gpu(None, problems=[BAD], holders=["17"], now=T0, **kw)
    assert d.record is not None and (d.record.step, d.record.scope) == ("evicting", "slurm")
    later = T0 + timedelta(seconds=3600)
    d = iso.decide_gpu(d.record, problems=[BAD], holders=[], now=later, **kw)
    assert d.record is not None and d.record.step == "isolated" and d.ops == ()
    assert "no per-GPU reset" in d.reason and d.episode is not None
    assert iso.decide_gpu(None, problems=[BAD], holders=[], now=T0, **kw).record.step == (
        "isolated"
    )


def test_a_degraded_node_drain_is_the_gpu_paths() -> None:
    raw = {"name": "gpu2", "state": "idle", "state_flags": ["DRAIN"], "partitions": ["gpu"],
           "reason": "gpuvigil gpu GPU-3 idx 3: XID_94"}  # fmt: skip
    v = view(raw, isolation_text='{"x": 1}')
    assert not v.blocked_by_us and not v.blocked_by_others and v.isolation_text == '{"x": 1}'
