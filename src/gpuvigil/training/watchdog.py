"""The hang watchdog: a rank whose steps stop completing dumps its stacks and exits.

Started by `run.Run`, kicked once per completed step. A daemon thread checks, every
`poll_s`, that a step completed within the timeout (fixed, or derived from observed step
times by `derive_timeout`, which is pure). When it fires it:
1. dumps every thread's Python stack (stderr and a file per rank),
2. writes an attribution record (rank, node, last step, where the main thread is, whether
   it waits in torch collectives/backward: a rank that does not is the likely culprit),
   and names the rank that never entered the collective its peers wait in: each firing
   rank raises a flag in the job's c10d store so peers on other nodes fire at once, then
   publishes the default group's collective sequence number (also in its heartbeat, for the
   monitor) and whether its stack is in a collective, and reads its peers'. `judge` (pure)
   names the culprit: a peer that publishes nothing (frozen, dead), else the ranks with the
   lowest number (they never entered the collective the others wait in, even when their
   own stack is inside torch: stuck in backward before the all-reduce), else a rank outside
   any collective while its peers wait in one; all ranks in the same collective blame no
   rank (the fabric, or a peer outside the job),
3. dumps its stacks to stderr too,
4. exits with `exit_codes.HANG`, so torchrun restarts the group now instead of after the
   collective timeout (NCCL's default is 10 minutes; gloo's 30).
`faulthandler.dump_traceback_later` backs it up for a main thread that holds the GIL.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuvigil.core import exit_codes
from gpuvigil.training.config import WatchdogConfig
from gpuvigil.training.heartbeat import HeartbeatWriter

log = logging.getLogger("gpuvigil.training.watchdog")

HANG_KEY = "gpuvigil/hang"
SEQ_KEY = "gpuvigil/seq/{rank}"  # a firing rank's collective sequence number
READ_KEY = "gpuvigil/seq-read/{rank}"  # that rank has read its peers' numbers
BACKSTOP_GRACE_S = 30.0  # the faulthandler backstop fires at 2 x timeout + this
_TORCH_WAIT = ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/")


def derive_timeout(
    step_times_s: Sequence[float], config: WatchdogConfig, *, steps_this_attempt: int = 1
) -> float:
    """Pure: the fixed timeout; else initial_timeout_s for an attempt's first step and until
    warmup_steps step times are known (an attempt that resumed knows the ones before it);
    else factor * p99, at least min_timeout_s."""
    if config.timeout_s is not None:
        return config.timeout_s
    if steps_this_attempt < 1 or len(step_times_s) < config.warmup_steps:
        return config.initial_timeout_s
    ordered = sorted(step_times_s)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return max(config.min_timeout_s, config.factor * p99)


def behind(seqs: dict[int, int]) -> tuple[int, ...]:
    """Pure: the ranks that never entered the collective their peers wait in (their
    collective sequence number is below the highest); () when all agree or none is known."""
    known = {r: s for r, s in seqs.items() if s >= 0}
    if len(known) < 2:
        return ()
    top = max(known.values())
    return tuple(sorted(r for r, s in known.items() if s < top))


def _parse_seq(raw: bytes | str) -> tuple[int, bool]:
    """A peer's published "seq in_collective" (an older rank publishes the number alone)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    parts = text.split()
    try:
        return int(parts[0]), (bool(int(parts[1])) if len(parts) > 1 else True)
    except (IndexError, ValueError):
        return -1, True


@dataclass(frozen=True)
class Verdict:
    """Who a hang is charged to, from what the firing ranks published (`judge`)."""

    culprits: tuple[int, ...]  # the ranks blamed; () when no rank is
    why: str  # silent | behind | outside | own | fabric | unknown
    text: str  # for people, with the sequence numbers as evidence


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def judge(
    seen: dict[int, tuple[int, bool]], *, world: int, asked: bool = True, wait_s: float = 0.0
) -> Verdict:
    """Pure: the culprit of a hang from what each rank published ({rank: (collective
    sequence number, -1 when unknown; whether its stack is in a collective)}). `asked`: the
    peers were asked through a working store, so a rank of the `world` that published
    nothing within `wait_s` is silent (frozen, dead, or its GIL held: its heartbeat stopped)."""
    silent = tuple(r for r in range(world) if r not in seen) if asked and world > 1 else ()
    known = {r: s for r, (s, _) in seen.items() if s >= 0}
    nums = ", ".join(f"rank {r}: {s}" for r, s in sorted(known.items()))
    evidence = f" (collectives entered: {nums})" if nums else ""
    if silent and seen:
        # Checked first: a rank that cannot answer holds up any collective its peers are in,
        # including the one a peer behind the others waits in.
        return Verdict(
            silent,
            "silent",
            f"{_ranks(silent)} published nothing within {wait_s:.1f}s (frozen, dead or holding "
            f"the GIL) while {_ranks(sorted(seen))} waited{evidence}",
        )
    if len(known) >= 2 and min(known.values()) < max(known.values()):
        low = min(known.values())
        late = tuple(sorted(r for r, s in known.items() if s == low))
        return Verdict(
            late,
            "behind",
            f"{_ranks(late)} entered {low} collectives and never entered #{low + 1}, which "
            f"{_ranks(sorted(r for r, s in known.items() if s > low))} entered{evidence}",
        )
    inside = sorted(r for r, (_, c) in seen.items() if c)
    outside = tuple(sorted(r for r, (_, c) in seen.items() if not c))
    if inside and outside:
        return Verdict(
            outside,
            "outside",
            f"{_ranks(outside)} is outside any collective while {_ranks(inside)} waits in one"
            f"{evidence}",
        )
    if outside:  # nobody waits in a collective: each rank is stuck in its own code
        return Verdict(outside, "own", f"{_ranks(outside)} stuck outside any collective")
    if len(seen) >= 2:
        n = (
            f"collective #{next(iter(known.values()))}"
            if len(known) == len(seen)
            else "a collective"
        )
        return Verdict(
            (),
            "fabric",
            f"all ranks in {n}: the fabric or a peer outside the job; no rank is blamed{evidence}",
        )
    return Verdict(
        (), "unknown", "waiting in a collective; no peer answered to compare with: no culprit"
    )


@dataclass(frozen=True)
class HangRecord:
    rank: int
    node: str
    step: int  # last completed step
    waited_s: float
    timeout_s: float
    where: str  # innermost frame of the main thread
    in_collective: bool  # main thread is inside torch collectives/backward (a victim)
    reason: str  # "timeout" or "peer" (another rank fired first)
    stack_file: str
    seq: int = -1  # collectives this rank entered (the default group's sequence number)
    behind: tuple[int, ...] = ()  # ranks that never entered the collective the others wait in
    verdict: Verdict | None = None  # who the hang is charged to (`judge`)
    seqs: dict[int, int] | None = None  # each answering rank's sequence number: the evidence

    @property
    def culprit(self) -> bool:
        """This rank is the one its peers wait for, wherever its stack is."""
        if self.verdict is None:
            return self.rank in self.behind
        return self.rank in self.verdict.culprits

    def data(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("node", "verdict", "seqs")}
        v = self.verdict
        culprits = list(v.culprits) if v is not None else list(self.behind)
        return {
            **out,
            "behind": list(self.behind),
            "culprit": self.culprit,
            # The rank the hang is charged to (the lowest of several); None: no rank is.
            "culprit_rank": culprits[0] if culprits else None,
            "culprit_ranks": culprits,
            "verdict": v.why if v is not None else "",
            "verdict_text": v.text if v is not None else "",
            "seqs": {str(r): s for r, s in sorted((self.seqs or {}).items())},
        }


def main_thread_stack() -> list[traceback.FrameSummary]:
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    return traceback.extract_stack(frame) if frame is not None else []


class Watchdog:
    def __init__(
        self,
        config: WatchdogConfig,
        *,
        rank: int,
        node: str,
        dump_dir: Path,
        on_fire: Callable[[HangRecord], None] = lambda record: None,
        store: Any = None,  # a c10d Store (get/set/check) shared by this attempt's ranks
        exit: Callable[[int], None] = os._exit,
        heartbeat: HeartbeatWriter | None = None,
        world_size: int = 1,
        collective_seq: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.rank, self.node, self.dump_dir = rank, node, dump_dir
        self._on_fire, self._store, self._exit = on_fire, store, exit
        self._hb = heartbeat
        self._world, self._collective_seq = world_size, collective_seq
        self._times: deque[float] = deque(maxlen=1000)
        self._last_kick = self._armed_at = time.monotonic()
        self._step = 0
        self._kicks = 0  # steps completed in this attempt
        self._paused = 0
        self._timeout = derive_timeout((), config, steps_this_attempt=0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuvigil-watchdog", daemon=True)
        self.fired: HangRecord | None = None

    @property
    def timeout_s(self) -> float:
        return self._timeout

    @property
    def step_times(self) -> list[float]:
        return list(self._times)

    def seed(self, step_times_s: Sequence[float]) -> None:
        """Step times of the attempt a resume continues: derive the timeout from them."""
        self._times.extend(float(t) for t in step_times_s if t > 0)

    def start(self) -> Watchdog:
        self._last_kick = time.monotonic()
        if self._hb is not None:
            self._hb.start(self._last_kick, self._timeout)
        self._arm_backstop()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._hb is not None:
            self._hb.finish()
        faulthandler.cancel_dump_traceback_later()
        if self._thread.is_alive():
            self._thread.join(timeout=self.config.poll_s * 2)

    def kick(self, step: int, step_time_s: float) -> None:
        """One completed step (the hot path: a clock read and a deque append)."""
        now = time.monotonic()
        if now - self._armed_at > self.config.poll_s:  # re-arm about once per poll, not per step
            self._arm_backstop()
        self._last_kick = now
        self._step = step
        self._kicks += 1
        self._times.append(step_time_s)
        if self._hb is not None:
            self._hb.step(step, now)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Suspend during long, legitimate stalls between steps (a synchronous save, a load)."""
        self._paused += 1
        faulthandler.cancel_dump_traceback_later()
        self._beat()
        try:
            yield
        finally:
            self._paused -= 1
            self._last_kick = time.monotonic()
            self._beat()
            self._arm_backstop()

    def _beat(self) -> None:
        if self._hb is not None:
            self._hb.state(
                timeout_s=self._timeout,
                paused=self._paused > 0,
                now=time.monotonic(),
                seq=self._seq(),
            )

    def _seq(self) -> int:
        if self._collective_seq is None:
            return -1
        try:
            return int(self._collective_seq())
        except Exception:  # noqa: BLE001 (a group torn down: the number is unknown, not fatal)
            return -1

    def _peer_seqs(self, seq: int, in_collective: bool) -> tuple[dict[int, tuple[int, bool]], bool]:
        """Publish this rank's sequence number and whether it waits in a collective, and read
        its peers' for a short while (they fire within a poll of each other: the flag raised
        before this). A peer that publishes nothing is silent: frozen, dead, or its GIL held.
        Also returns whether the peers were asked at all (no store, or a broken one: silence
        is no evidence then)."""
        seen = {self.rank: (seq, in_collective)}
        if self._store is None or self._world < 2:
            return seen, False
        deadline = time.monotonic() + self._wait_s()
        try:
            self._store.set(SEQ_KEY.format(rank=self.rank), f"{seq} {int(in_collective)}")
            while len(seen) < self._world and time.monotonic() < deadline:
                for r in range(self._world):
                    key = SEQ_KEY.format(rank=r)
                    if r not in seen and self._store.check([key]):
                        seen[r] = _parse_seq(self._store.get(key))
                if len(seen) < self._world:
                    time.sleep(0.05)
            # Stay until the peers that answered have read every number too: the store's
            # host is one of the ranks (rank 0), and its exit would leave them none.
            self._store.set(READ_KEY.format(rank=self.rank), "1")
            while time.monotonic() < deadline + 1.0:
                keys = [READ_KEY.format(rank=r) for r in seen]
                if self._store.check(keys):
                    break
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 (best effort: the record says less, nothing more)
            log.warning("could not compare collective sequence numbers: %s", e)
            return seen, False
        return seen, True

    def _wait_s(self) -> float:
        return min(5.0, max(1.0, 3 * self.config.poll_s))

    def _raise_flag(self) -> None:
        if self._store is None:
            return
        try:
            self._store.set(HANG_KEY, f"{self.rank}")
        except Exception as e:  # noqa: BLE001 (best effort: peers still time out on their own)
            log.warning("could not signal peers through the store: %s", e)

    def _arm_backstop(self) -> None:
        if self._paused or self._stop.is_set():
            return
        # Fires only if this thread could not (the main thread holds the GIL in C code).
        self._armed_at = time.monotonic()
        faulthandler.dump_traceback_later(2 * self._timeout + BACKSTOP_GRACE_S, exit=True)

    def _peer_fired(self) -> bool:
        if self._store is None:
            return False
        try:
            return bool(self._store.check([HANG_KEY]))
        except Exception:  # noqa: BLE001 (store gone (its host died): the local timeout still works)
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.config.poll_s):
            self._timeout = derive_timeout(
                list(self._times), self.config, steps_this_attempt=self._kicks
            )
            self._beat()
            if self._paused:
                continue
            waited = time.monotonic() - self._last_kick
            if waited > self._timeout:
                self.fire(reason="timeout", waited_s=waited)
                return
            if self._peer_fired():
                self.fire(reason="peer", waited_s=waited)
                return

    def fire(self, *, reason: str, waited_s: float) -> None:
        stack = main_thread_stack()
        where = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else "?"
        in_collective = any(any(p in f.filename for p in _TORCH_WAIT) for f in stack)
        seq = self._seq()
        if reason == "timeout":
            # Before comparing numbers: a peer on a longer (derived) timeout must fire and
            # publish now, not be taken for a silent one.
            self._raise_flag()
        seen, asked = self._peer_seqs(seq, in_collective)
        seqs = {r: s for r, (s, _) in seen.items()}
        late = behind(seqs)
        verdict = judge(seen, world=self._world, asked=asked, wait_s=self._wait_s())
        path = self.dump_dir / f"hang-rank{self.rank}-pid{os.getpid()}.txt"
        try:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as fh:
                fh.write(
                    f"gpuvigil hang watchdog: rank {self.rank} on {self.node}, last step "
                    f"{self._step}, waited {waited_s:.1f}s (timeout {self._timeout:.1f}s), "
                    f"reason {reason}\n"
                )
                fh.flush()
                faulthandler.dump_traceback(fh, all_threads=True)
        except OSError as e:
            log.error("cannot write stack dump %s: %s", path, e)
        record = HangRecord(
            self.rank,
            self.node,
            self._step,
            round(waited_s, 3),
            round(self._timeout, 3),
            where,
            in_collective,
            reason,
            str(path),
            seq,
            late,
            verdict,
            seqs,
        )
        self.fired = record
        if record.culprit:
            why = f" (this rank is the culprit: {verdict.text})"
        elif verdict.culprits:
            who = _ranks(verdict.culprits)
            why = f" (the culprit is {who}: {verdict.text}; this rank is a victim)"
        else:
            why = f" (no culprit: {verdict.text})"
        log.error(
            "gpuvigil hang watchdog fired on rank %d (node %s): no step completed for %.1fs "
            "(timeout %.1fs, reason %s); last step %d; main thread at %s%s; stacks in %s; "
            "exiting with code %d so torchrun restarts the group",
            self.rank,
            self.node,
            waited_s,
            self._timeout,
            reason,
            self._step,
            where,
            why,
            path,
            exit_codes.HANG,
        )
        sys.stderr.write(f"--- gpuvigil: stacks of rank {self.rank} ---\n")
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        sys.stderr.flush()
        try:
            self._on_fire(record)
        except Exception as e:  # the exit below must happen whatever failed
            log.error("hang record could not be written: %s", e, exc_info=True)
        for h in logging.getLogger().handlers:
            h.flush()
        self._exit(exit_codes.HANG)
