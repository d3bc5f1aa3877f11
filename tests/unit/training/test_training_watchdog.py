"""Hang watchdog: timeout derivation (pure) and firing on a real thread with a real store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpuvigil.core import exit_codes
from gpuvigil.training.config import WatchdogConfig
from gpuvigil.training.watchdog import HANG_KEY, HangRecord, Watchdog, derive_timeout


def test_fixed_timeout_wins() -> None:
    assert derive_timeout([1.0] * 100, WatchdogConfig(timeout_s=7)) == 7


def test_initial_timeout_until_warmup() -> None:
    cfg = WatchdogConfig(warmup_steps=10, initial_timeout_s=600)
    assert derive_timeout([0.1] * 9, cfg) == 600


def test_derived_from_p99_with_a_floor() -> None:
    cfg = WatchdogConfig(warmup_steps=10, factor=10, min_timeout_s=60)
    assert derive_timeout([0.1] * 100, cfg) == 60  # 10 * 0.1 = 1 s is below the floor
    times = [1.0] * 98 + [9.0, 12.0]
    assert derive_timeout(times, cfg) == pytest.approx(120.0)  # p99 = 12 s


def test_outlier_below_p99_does_not_dominate() -> None:
    cfg = WatchdogConfig(warmup_steps=10, factor=10, min_timeout_s=1)
    times = [0.5] * 1000 + [50.0]  # one slow checkpoint step among a thousand
    assert derive_timeout(times, cfg) == pytest.approx(5.0)


def _watchdog(tmp_path: Path, **kw: object) -> tuple[Watchdog, list[int], list[HangRecord]]:
    exits: list[int] = []
    records: list[HangRecord] = []
    cfg = WatchdogConfig(timeout_s=0.5, poll_s=0.05)
    wd = Watchdog(
        cfg, rank=3, node="n1", dump_dir=tmp_path, on_fire=records.append, exit=exits.append, **kw
    )  # type: ignore[arg-type]
    return wd, exits, records


def _until_fired(exits: list[int], timeout_s: float = 5.0) -> None:
    """Poll (the watchdog fires on its own thread) until it exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not exits and time.monotonic() < deadline:
        time.sleep(0.02)


def test_fires_when_steps_stop_and_dumps_stacks(tmp_path: Path) -> None:
    wd, exits, records = _watchdog(tmp_path)
    wd.start()
    try:
        for step in range(1, 6):
            wd.kick(step, 0.01)
            time.sleep(0.05)
        assert exits == []
        _until_fired(exits)
    finally:
        wd.stop()
    assert exits == [exit_codes.HANG]
    (rec,) = records
    assert (rec.rank, rec.node, rec.step, rec.reason) == (3, "n1", 5, "timeout")
    assert 0.5 <= rec.waited_s < 0.5 + 1.0
    assert "test_training_watchdog.py" in rec.where  # the main thread was sleeping in this test
    dump = Path(rec.stack_file).read_text()
    assert "gpuvigil-watchdog" in dump or "Thread" in dump
    assert "test_fires_when_steps_stop" in dump


def test_paused_does_not_fire(tmp_path: Path) -> None:
    wd, exits, _ = _watchdog(tmp_path)
    wd.start()
    try:
        with wd.paused():
            time.sleep(1.0)
        assert exits == []
    finally:
        wd.stop()


def test_peer_flag_in_the_store_fires_at_once(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    wd, exits, records = _watchdog(tmp_path, store=store)
    wd.config = WatchdogConfig(timeout_s=60, poll_s=0.05)
    wd.start()
    try:
        threading.Timer(0.2, lambda: store.set(HANG_KEY, "0")).start()
        _until_fired(exits)
    finally:
        wd.stop()
    assert exits == [exit_codes.HANG]
    assert records[0].reason == "peer"


def test_firing_rank_raises_the_flag_for_peers(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    wd, exits, _ = _watchdog(tmp_path, store=store)
    wd.fire(reason="timeout", waited_s=1.0)
    assert exits == [exit_codes.HANG]
    assert store.get(HANG_KEY) == b"3"


_BACKSTOP = """
import time
from pathlib import Path
from gpuvigil.training import watchdog
from gpuvigil.training.config import WatchdogConfig
watchdog.BACKSTOP_GRACE_S = 0.0  # backstop at 2 x 0.5 s: it must keep moving while steps do
wd = watchdog.Watchdog(WatchdogConfig(timeout_s=0.5, poll_s=0.05), rank=0, node="n",
                       dump_dir=Path("."), exit=lambda code: None).start()
t0 = time.monotonic()
while time.monotonic() - t0 < {run_s}:
    wd.kick(1, 0.001)
    time.sleep(0.005)
wd._stop.set()  # leave the backstop armed: only it can end the process now
time.sleep({idle_s})
print("alive")
"""


def test_faulthandler_backstop_follows_progress_and_fires_without_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    from testkit import cli_env

    def run(run_s: float, idle_s: float) -> subprocess.CompletedProcess[str]:
        code = _BACKSTOP.format(run_s=run_s, idle_s=idle_s)
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=cli_env(),
            cwd=tmp_path,
            timeout=60,
            check=False,
        )

    healthy = run(2.5, 0.0)  # 2.5 s of fast steps: longer than the 1 s backstop
    assert healthy.returncode == 0 and "alive" in healthy.stdout, healthy.stderr
    stuck = run(0.2, 3.0)  # then no progress, and the watchdog thread is gone
    assert stuck.returncode == 1 and "alive" not in stuck.stdout
    assert "Timeout" in stuck.stderr  # faulthandler's dump


def test_stopped_watchdog_never_rearms(tmp_path: Path) -> None:
    wd, exits, _ = _watchdog(tmp_path)
    wd.start()
    wd.stop()
    with wd.paused():
        pass
    wd.kick(1, 0.1)
    time.sleep(0.3)
    assert exits == [] and wd.fired is None
    assert wd._armed_at < time.monotonic() - 0.25


def test_an_attempts_first_step_gets_the_initial_timeout_then_the_seeded_history() -> None:
    """A resumed attempt knows the step times saved with its checkpoint: after its first
    step (compilation, warmup) it needs no 10 new steps to leave the 600 s timeout."""
    cfg = WatchdogConfig(min_timeout_s=5)
    seeded = [0.2] * 50
    assert derive_timeout(seeded, cfg, steps_this_attempt=0) == 600
    assert derive_timeout(seeded, cfg, steps_this_attempt=1) == 5  # 10 x 0.2 s, floored


def test_the_rank_behind_its_peers_collective_count_is_the_culprit() -> None:
    from gpuvigil.training.watchdog import behind

    assert behind({0: 41, 1: 40, 2: 41, 3: 41}) == (1,)
    assert behind({0: 41, 1: 41}) == ()  # all in the same collective: no one is behind
    assert behind({0: 41}) == ()  # no peer to compare with
    assert behind({0: 41, 1: -1, 2: 39}) == (2,)  # an unknown number is no evidence
    assert behind({0: 12, 1: 10, 2: 11}) == (1, 2)


def test_judge_names_the_culprit_of_a_collective_hang() -> None:
    from gpuvigil.training.watchdog import judge

    # 1. rank 1 stuck in its own code, rank 0 in the all-reduce it never entered.
    v = judge({0: (13, True), 1: (12, False)}, world=2)
    assert (v.culprits, v.why) == ((1,), "behind")
    assert "rank 1 entered 12 collectives and never entered #13" in v.text
    assert "rank 0: 13, rank 1: 12" in v.text  # the numbers are the evidence
    # 2. both inside torch, rank 1 in an earlier collective (mismatched collectives).
    assert judge({0: (13, True), 1: (12, True)}, world=2).culprits == (1,)
    # Three ranks: the lowest never entered the one rank 2 waits in; rank 2 is a victim too.
    assert judge({0: (12, True), 1: (10, True), 2: (11, True)}, world=3).culprits == (1,)
    # 3. every rank in the same collective: nobody is blamed, and the record says why.
    v = judge({0: (13, True), 1: (13, True)}, world=2)
    assert (v.culprits, v.why) == ((), "fabric")
    assert "all ranks in collective #13" in v.text and "the fabric or a peer outside" in v.text
    assert "victim" not in v.text
    # 4. a rank that published nothing (frozen, dead): the culprit, before any number.
    v = judge({0: (13, True), 2: (12, True)}, world=3, wait_s=3.0)
    assert (v.culprits, v.why) == ((1,), "silent")
    assert "rank 1 published nothing within 3.0s" in v.text
    # Silence is evidence only when the peers were asked through a working store.
    assert judge({0: (13, True)}, world=2, asked=False).why == "unknown"


def test_judge_without_numbers_uses_where_the_stacks_are() -> None:
    from gpuvigil.training.watchdog import judge

    # Equal numbers (a collective on another group), or none: the rank outside is the one.
    v = judge({0: (-1, True), 1: (-1, False)}, world=2)
    assert (v.culprits, v.why) == ((1,), "outside")
    assert judge({0: (-1, True), 1: (-1, True)}, world=2).why == "fabric"
    assert judge({0: (-1, False)}, world=1).culprits == (0,)  # alone, in its own code
    assert judge({0: (5, True)}, world=1).culprits == ()  # alone in a collective: unknown


def test_record_data_carries_the_culprit_rank_and_the_numbers() -> None:
    from gpuvigil.training.watchdog import judge

    seen = {0: (13, True), 1: (12, False)}
    rec = HangRecord(0, "n", 5, 3.1, 3.0, "x", True, "timeout", "f", 13, (1,),
                     judge(seen, world=2), {0: 13, 1: 12})  # fmt: skip
    d = rec.data()
    assert (d["culprit"], d["culprit_rank"], d["culprit_ranks"]) == (False, 1, [1])
    assert (d["verdict"], d["seqs"]) == ("behind", {"0": 13, "1": 12})
    fabric = HangRecord(0, "n", 5, 3.1, 3.0, "x", True, "timeout", "f", 13, (),
                        judge({0: (13, True), 1: (13, True)}, world=2))  # fmt: skip
    assert fabric.data()["culprit_rank"] is None and fabric.data()["verdict"] == "fabric"


def _fire_both(tmp_path: Path, seq: dict[int, int]) -> list[HangRecord]:
    """Two watchdogs on one real store fire at once, as the two ranks of a hung job do (rank 1
    on its timeout, rank 0 on the flag it raises)."""
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    records: list[HangRecord] = []
    threads = []
    for rank, reason in ((0, "peer"), (1, "timeout")):
        wd = Watchdog(WatchdogConfig(timeout_s=60, poll_s=0.05), rank=rank, node=f"n{rank}",
                      dump_dir=tmp_path, on_fire=records.append, exit=lambda code: None,
                      store=store, world_size=2,
                      collective_seq=lambda r=rank: seq[r])  # fmt: skip
        kw = {"reason": reason, "waited_s": 1.0}
        threads.append(threading.Thread(target=wd.fire, kwargs=kw))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return sorted(records, key=lambda r: r.rank)


def test_two_watchdogs_on_a_real_store_agree_on_the_culprit(tmp_path: Path) -> None:
    # Each main thread here sleeps in this test, not in torch (in_collective False on both):
    # the numbers alone name rank 1, on both ranks.
    r0, r1 = _fire_both(tmp_path, {0: 13, 1: 12})
    assert r0.data()["culprit_rank"] == r1.data()["culprit_rank"] == 1
    assert (r0.culprit, r1.culprit) == (False, True)
    assert r0.data()["seqs"] == {"0": 13, "1": 12}
    r0, _ = _fire_both(tmp_path, {0: 13, 1: 13})
    assert r0.verdict is not None and r0.verdict.why == "own"  # both stuck in their own code


def test_a_peer_that_never_publishes_is_the_culprit(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    store = dist.HashStore()
    wd, _, records = _watchdog(tmp_path, store=store, world_size=4,
                               collective_seq=lambda: 13)  # fmt: skip
    wd.fire(reason="timeout", waited_s=1.0)
    (rec,) = records
    # Rank 3 alone answered: ranks 0-2 are silent (frozen or dead), the lowest is named.
    assert rec.data()["culprit_ranks"] == [0, 1, 2] and rec.data()["culprit_rank"] == 0
    assert rec.data()["verdict"] == "silent"
    assert store.get(HANG_KEY) == b"3"  # raised before waiting: a slower peer fires now


@pytest.mark.parametrize(
    ("rank", "seen", "kind", "detail"),
    [
        (1, {0: (13, True), 1: (12, False)}, "behind", "waited for rank 1"),  # stuck, behind
        (0, {0: (13, True), 1: (12, False)}, "victim", "waited for rank 1"),
        (1, {0: (-1, True), 1: (-1, False)}, "hang", "waited for rank 1"),  # outside, no numbers
        (0, {0: (13, True), 1: (13, True)}, "victim", "all ranks in collective #13: the fabric"),
    ],
)
def test_the_exit_record_charges_the_verdicts_culprit(
    tmp_path: Path, rank: int, seen: dict[int, tuple[int, bool]], kind: str, detail: str
) -> None:
    from types import SimpleNamespace

    from gpuvigil.training import lifecycle
    from gpuvigil.training.journal import Journal
    from gpuvigil.training.storage import LocalStorage
    from gpuvigil.training.watchdog import judge

    journal = Journal(SimpleNamespace(rank=rank, node="n", job="j"))  # type: ignore[arg-type]
    journal.storage = LocalStorage(str(tmp_path))
    s, inside = seen[rank]
    record = HangRecord(rank, "n", 5, 3.1, 3.0, "x", inside, "timeout", "f", s, (),
                        judge(seen, world=2))  # fmt: skip
    journal.hung(record)
    (exit_record,), _ = lifecycle.read_exits(journal.storage)
    assert exit_record.kind == kind and detail in exit_record.detail, exit_record
