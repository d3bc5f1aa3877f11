"""Calibration: the default fault model reproduces the Llama 3 405B pre-training record."""

from __future__ import annotations

from gpuvigil.sim.run import simulate

PAPER = 419  # unexpected interruptions in 54 days on 16,384 H100 (Dubey et al. 2024, Table 5)
PAPER_SHARES = {"gpu": 0.587, "software": 0.134, "network": 0.084, "maintenance": 0.076}


def test_llama3_baseline_within_ten_percent_of_the_paper():
    r = simulate("baseline", workload="llama3", seed=1, events=False)
    assert r.nodes == 2176 and r.days == 54  # 2,048 job nodes + 128 spares
    assert abs(r.calibrated_interruptions - PAPER) <= 0.10 * PAPER, r.calibrated_interruptions
    total = r.calibrated_interruptions
    shares = {c: n / total for c, n in r.calibrated_by_cause.items()}
    assert abs(shares["gpu"] - PAPER_SHARES["gpu"]) < 0.06, shares
    for cause in ("software", "network", "maintenance"):
        assert abs(shares[cause] - PAPER_SHARES[cause]) < 0.05, (cause, shares)
