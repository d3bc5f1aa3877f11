"""The one exit-code table: who is charged for each code, and what a retry policy spares."""

from __future__ import annotations

import pytest

from gpuvigil.core import exit_codes as ec


@pytest.mark.parametrize(
    ("code", "charged"),
    [
        (0, ec.Charged.NONE),
        (1, ec.Charged.USER),
        (ec.HANG, ec.Charged.HANG),
        (ec.NODE_UNHEALTHY, ec.Charged.NODE),
        (ec.NODE_STATE_UNKNOWN, ec.Charged.NODE),
        (ec.DRAINED, ec.Charged.DRAIN),
        (ec.CHECKPOINT_FAILED, ec.Charged.STORAGE),
        (ec.NO_VERIFIED_CHECKPOINT, ec.Charged.STORAGE),
        (137, ec.Charged.UNKNOWN),
        (-9, ec.Charged.UNKNOWN),
    ],
)
def test_who_is_charged(code: int, charged: ec.Charged) -> None:
    assert ec.charged(code) is charged


def test_gpuvigil_codes_are_never_the_users() -> None:
    for code in (ec.HANG, ec.NODE_UNHEALTHY, ec.NODE_STATE_UNKNOWN, ec.DRAINED):
        assert ec.charged(code) is not ec.Charged.USER


def test_signals_are_named() -> None:
    assert ec.lookup(137).name == "SIGKILL"
    assert ec.lookup(-15).name == "SIGTERM"
    assert ec.lookup(128 + 99).name == "signal 99"


def test_spared_codes_are_the_nodes_and_the_drains() -> None:
    assert ec.spared() == (ec.NODE_UNHEALTHY, ec.NODE_STATE_UNKNOWN, ec.DRAINED)


def test_what_a_retry_cannot_change_is_never_retried() -> None:
    # all checkpoints damaged (the same folders again), a loader that cannot resume exactly
    # (the same script builds it again)
    assert ec.spared(ec.Retry.FAIL) == (ec.NO_VERIFIED_CHECKPOINT, ec.NOT_RESUMABLE)
    assert ec.TABLE[ec.NOT_RESUMABLE].charged is ec.Charged.USER


def test_codes_stay_out_of_reserved_ranges() -> None:
    for code in ec.TABLE:
        if code == ec.SUCCESS:
            continue
        assert not 0 <= code <= 2
        assert not 64 <= code <= 78
        assert not 126 <= code <= 165
