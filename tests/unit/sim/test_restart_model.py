"""The simulator's restart costs come from the lab's measured phases (sim/restart_phases.yaml),
scaled to the job's size: every phase cites the run or bench behind it, and a cold restart
costs more as the gang's pods grow."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from gpuvigil.sim import restart, restart_model
from gpuvigil.sim.scenarios import SimConfig

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def test_every_phase_cites_a_dated_lab_run_or_bench() -> None:
    model = restart_model.load()
    assert tuple(model.phases) == restart_model.PHASES
    assert DATE.search(model.anchor.source) and "gpuvigil lab" in model.anchor.source
    for name, phase in model.phases.items():
        assert phase.source.startswith("lab:") and DATE.search(phase.source), name
        if phase.scales_with != "fixed":  # its rate is a measurement too: name the bench
            assert "bench/" in phase.source, name


def test_cold_restart_grows_with_the_gangs_pods_and_in_place_skips_the_control_plane() -> None:
    cfg = SimConfig()
    cold = [restart.restart_cost_s(cfg, nodes=n, ranks=8 * n, mode="cold") for n in (2, 64, 2048)]
    assert cold[0] < cold[1] < cold[2]
    # the lab's own size gives back the lab's seconds, the restore's shard aside
    model = restart_model.load()
    lab = model.cost_s(pods=2, ranks=2, ckpt_bytes=model.anchor.checkpoint_bytes_per_rank,
                       mode="cold")  # fmt: skip
    assert lab == pytest.approx(sum(p.seconds for p in model.phases.values()))
    # the control plane's per-pod terms are most of a 2,048-pod restart (bench/gang_reschedule)
    pods = model.phase_s("stop", pods=2048, ranks=16384, ckpt_bytes=0) + model.phase_s(
        "reschedule", pods=2048, ranks=16384, ckpt_bytes=0
    )
    assert pods > 0.5 * cold[2]
    warm = restart.restart_cost_s(cfg, nodes=2048, ranks=16384, mode="in_place")
    assert warm == pytest.approx(cold[2] - pods)


def test_keeping_the_survivors_costs_the_lost_pods_phases_not_the_gangs() -> None:
    cfg = SimConfig()
    cold = restart.restart_cost_s(cfg, nodes=2048, ranks=16384, mode="cold")
    kept = restart.restart_cost_s(cfg, nodes=2048, ranks=16384, mode="survivors_kept",
                                  lost_pods=1)  # fmt: skip
    model = restart_model.load()
    # no pod stopped, one rescheduled; every rank still meets the new generation's group
    expect = sum(
        model.phase_s(
            n,
            pods=1 if n == "reschedule" else 2048,
            ranks=16384,
            ckpt_bytes=cfg.checkpoint_bytes_per_rank,
            mode="survivors_kept",
        )
        for n in ("reschedule", "process_start", "rendezvous", "restore", "first_step")
    )
    assert kept == pytest.approx(expect) and kept < 0.05 * cold
    # the lab's in-process job measured its own phases: one interpreter starts, not
    # torchrun's agent and its worker
    measured = model.survivors_kept_seconds
    assert set(measured) <= set(model.survivors_kept) and "process_start" in measured
    assert measured["process_start"].seconds < model.phases["process_start"].seconds
    gang_phases = sum(model.phase_s(n, pods=1 if n == "reschedule" else 2048, ranks=16384,
                                    ckpt_bytes=cfg.checkpoint_bytes_per_rank)
                      for n in model.survivors_kept)  # fmt: skip
    assert kept < gang_phases
    two = restart.restart_cost_s(cfg, nodes=2048, ranks=16384, mode="survivors_kept",
                                 lost_pods=64)  # fmt: skip
    assert two > kept  # more lost pods, more to schedule
    # the in-memory tier's restore reads at its own rate, not DCP's
    mem = restart.restart_cost_s(cfg, nodes=2048, ranks=16384, mode="survivors_kept",
                                 lost_pods=1, from_memory=True)  # fmt: skip
    rate = model.phases["restore"].read_bytes_per_s
    gap = cfg.checkpoint_bytes_per_rank - model.anchor.checkpoint_bytes_per_rank
    assert mem - kept == pytest.approx(gap / cfg.memtier_restore_bytes_per_s - gap / rate)
    assert not restart.keeps_survivors(restart.Stop.HANG, layer3=True, in_process=True)
    assert not restart.keeps_survivors(restart.Stop.EVICTED, layer3=True, in_process=True)
    assert not restart.keeps_survivors(restart.Stop.CRASH, layer3=True, in_process=False)
    assert restart.keeps_survivors(restart.Stop.CRASH, layer3=True, in_process=True)
    # a drain keeps them only where every drained rank's copy stays on a rank that stays
    drain = {"layer3": True, "in_process": True, "graceful": True}
    assert restart.keeps_survivors(restart.Stop.EVICTED, **drain, memtier=True)
    assert not restart.keeps_survivors(restart.Stop.EVICTED, **drain, memtier=False)
    assert not restart.keeps_survivors(restart.Stop.EVICTED, layer3=True, in_process=True,
                                       graceful=False, memtier=True)  # fmt: skip


def test_a_phase_that_scales_needs_its_rate() -> None:
    with pytest.raises(ValidationError, match="needs its rate"):
        restart_model.Phase(seconds=1.0, scales_with="pods", source="lab: x 2026-12-07")
