"""The in-process restart's generation protocol on a real TCPStore (one process, no group):
survivors and a replacement meet in the same generation whoever comes first; a rank that
never comes is named within the bound; only a peer's loss restarts in process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from gpuvigil.core import exit_codes
from gpuvigil.training.config import RestartConfig, TrainingConfig
from gpuvigil.training.inprocess import (
    RankNotReplaced,
    Rendezvous,
    address,
    in_process,
    peer_lost,
)


@pytest.fixture
def store() -> Iterator[Any]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=5))
    del server  # the job's store server: it must outlive the test's clients


def _ranks(store: Any, n: int = 3, timeout_s: float = 0.3) -> list[Rendezvous]:
    return [Rendezvous(store, rank=r, world_size=n, timeout_s=timeout_s) for r in range(n)]


def _form(rdzv: list[Rendezvous], g: int) -> None:
    for r in rdzv:
        r.store.set(f"gen{g}/joined/{r.rank}", "1")
    for r in rdzv:
        r.join(g)
    rdzv[0].mark_formed(g)


def test_first_start_joins_generation_0(store: Any) -> None:
    rdzv = _ranks(store)
    assert [r.first() for r in rdzv] == [0, 0, 0]
    _form(rdzv, 0)
    assert rdzv[0].formed(0) and not rdzv[0].formed(1)


@pytest.mark.parametrize("replacement_first", [True, False])
def test_survivors_and_replacement_meet_whoever_comes_first(
    store: Any, replacement_first: bool
) -> None:
    rdzv = _ranks(store)
    assert {r.first() for r in rdzv} == {0}
    _form(rdzv, 0)
    replacement = Rendezvous(store, rank=1, world_size=3, timeout_s=0.3)
    if replacement_first:  # it starts before the survivors saw the loss: it moves the counter
        got = [replacement.first(), rdzv[0].next(0), rdzv[2].next(0)]
    else:
        got = [rdzv[0].next(0), rdzv[2].next(0), replacement.first()]
    assert got == [1, 1, 1]


def test_a_rank_that_never_joins_is_named_within_the_bound(store: Any) -> None:
    rdzv = _ranks(store, timeout_s=0.3)
    rdzv[2].store.set("gen0/joined/2", "1")
    t0 = time.monotonic()
    with pytest.raises(RankNotReplaced) as e:
        rdzv[0].join(0)
    assert time.monotonic() - t0 < 2
    assert e.value.code == exit_codes.RANK_NOT_REPLACED == 93
    assert e.value.missing == [1]
    assert "rank 1 never joined generation 0 within 0.3s" in e.value.message


def test_only_a_peer_loss_restarts_in_process() -> None:
    gloo = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:1: Connection reset by peer")
    assert peer_lost(gloo)
    wrapped = ValueError("the step failed")
    wrapped.__cause__ = gloo
    assert peer_lost(wrapped)
    assert not peer_lost(RuntimeError("injected bug at step 5"))
    assert not peer_lost(SystemExit(exit_codes.DRAINED))


def test_the_exit_code_is_counted_and_charged_to_no_one_yet() -> None:
    e = exit_codes.TABLE[exit_codes.RANK_NOT_REPLACED]
    assert e.charged is exit_codes.Charged.UNKNOWN and e.retry is exit_codes.Retry.COUNT


def test_off_by_default_and_init_refuses_when_on() -> None:
    assert TrainingConfig().restart.in_process is False
    from gpuvigil.training import process_group

    on = TrainingConfig.load(environ={"GPUVIGIL__TRAINING__RESTART__IN_PROCESS": "true"})
    assert on.restart.in_process
    with pytest.raises(ValueError, match=r"training.in_process\(train\)"):
        process_group.init(on)
    assert callable(in_process)


def test_store_address() -> None:
    assert address(RestartConfig(store="store.svc:29400")) == ("store.svc", 29400)
    env = {"MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    assert address(RestartConfig(), env) == ("node1", 29500)
    with pytest.raises(ValueError, match="host:port"):
        address(RestartConfig(store="nohost"))
