"""The per-node monitor: outside the ranks, it names a frozen or dead rank and unblocks the group.

Runs as a thread of `python -m gpuvigil.training.launch` (the torchrun agent of the node),
so it keeps running when a rank cannot: a rank stopped by SIGSTOP (or hung with its GIL
held) runs no watchdog thread of its own, its peers wait in a collective, and torchrun would
wait 30 s more to stop it after their watchdogs fire. Every `poll_s` the monitor reads each
local rank's heartbeat (`heartbeat`). A rank whose last step is older than its own hang
timeout plus `grace_s` (the rank's watchdog, if it can run, fires first and names itself) is
named with its node and its process state (`T`: frozen), recorded (a `hang` event and an
exit record) and SIGKILLed: SIGKILL is the one signal a stopped process obeys, torchrun's
wait for it ends, and its peers' collectives fail at once (their own watchdogs, on the same
timeout, have fired meanwhile). The group is then restarting within the timeout plus grace
plus one poll. A rank that dies is named from torchrun's own record of it (`launch` hands
the monitor the agent's failures). The monitor never talks to the ranks' store: a client
of a frozen store would block this process.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.training import heartbeat, lifecycle
from gpuvigil.training.config import TrainingConfig
from gpuvigil.training.storage import open_storage

log = logging.getLogger("gpuvigil.training.monitor")


def proc_state(pid: int) -> str:
    """The kernel's one-letter state of `pid` (R, S, D, T, Z, ...) or "" if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""


_STATES = {
    "T": "frozen (stopped by a signal)",
    "t": "frozen (stopped by a tracer)",
    "D": "hung in the kernel (uninterruptible sleep)",
    "R": "running but making no progress",
    "S": "sleeping and making no progress",
}


class Monitor:
    def __init__(self, config: TrainingConfig, run_dir: Path, *, node: str) -> None:
        self.config, self.run_dir, self.node = config, run_dir, node
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuvigil-monitor", daemon=True)
        self._acted: set[int] = set()
        self._lock = threading.Lock()
        self.named: list[dict[str, Any]] = []  # what the monitor found, for the launcher's exit

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # --- what the ranks say about themselves -------------------------------------------------
    def ranks(self) -> list[tuple[heartbeat.Beat, dict[str, Any]]]:
        out = []
        for path in sorted(self.run_dir.glob("local-*.hb")):
            beat = heartbeat.read(path)
            if beat is not None and beat == heartbeat.read(path):  # two equal reads: not torn
                out.append((beat, heartbeat.info(path)))
        return out

    def sidecar(self, pid: int) -> dict[str, Any]:
        return next((i for b, i in self.ranks() if b.pid == pid), {})

    def _loop(self) -> None:
        grace = self.config.monitor.grace_s
        while not self._stop.wait(self.config.monitor.poll_s):
            now = time.monotonic()
            for beat, info in self.ranks():
                if beat.pid in self._acted or beat.paused or beat.timeout_s <= 0:
                    continue
                state = proc_state(beat.pid)
                if state in ("", "Z", "X"):
                    continue  # gone: torchrun reports it and `failed` names it
                idle = now - beat.last_step_at
                if idle > beat.timeout_s + grace:
                    self._frozen(beat, info, state, idle)

    def _frozen(self, beat: heartbeat.Beat, info: dict[str, Any], state: str, idle: float) -> None:
        self._acted.add(beat.pid)
        what = _STATES.get(state, f"in state {state}")
        kind = "frozen" if state in ("T", "t") else "hang"
        node = str(info.get("node") or self.node)
        log.error(
            "gpuvigil monitor: rank %d (local %s, pid %d) on node %s is %s: no step for %.1fs "
            "(its hang timeout %.1fs), last step %d; killing it so the group restarts",
            beat.rank,
            info.get("local_rank", "?"),
            beat.pid,
            node,
            what,
            idle,
            beat.timeout_s,
            beat.step,
        )
        data = {
            "rank": beat.rank,
            "step": beat.step,
            "waited_s": round(idle, 3),
            "timeout_s": round(beat.timeout_s, 3),
            "reason": kind,
            "where": what,
            "in_collective": False,
            "seq": beat.seq,  # collectives it entered, from its heartbeat (-1: unknown)
            "by": "monitor",
            # Its heartbeat stopped: it is the culprit its peers' watchdogs call silent.
            "culprit": True,
            "culprit_rank": beat.rank,
            "culprit_ranks": [beat.rank],
            "verdict": "silent",
            "verdict_text": f"rank {beat.rank} {what}: its heartbeat stopped {idle:.1f}s ago "
            f"at step {beat.step}, after {beat.seq} collectives",
        }
        self._event(info, Kind.HANG, data, node=node)
        self._record(
            info,
            lifecycle.ExitRecord(
                time.time(),
                kind,
                beat.rank,
                node,
                -int(signal.SIGKILL),
                beat.step,
                f"{what}: no step for {idle:.1f}s (timeout {beat.timeout_s:.1f}s)",
                by="monitor",
            ),
        )
        try:
            os.kill(beat.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        with self._lock:
            self.named.append(
                {"rank": beat.rank, "node": node, "cause": lifecycle.cause_of(kind), "kind": kind}
            )

    def failed(self, failures: dict[int, Any]) -> None:
        """torchrun's agent saw these ranks exit ({global rank: ProcessFailure})."""
        for rank, f in sorted(failures.items()):
            pid, code = int(getattr(f, "pid", 0)), int(getattr(f, "exitcode", 1))
            if pid in self._acted:
                continue
            self._acted.add(pid)
            info = self.sidecar(pid) or {"rank": rank}
            how = (
                f"killed by {signal.Signals(-code).name}"
                if code < 0 and -code in signal.valid_signals()
                else f"exit code {code}"
            )
            log.error(
                "gpuvigil monitor: rank %d (pid %d) on node %s died: %s",
                rank,
                pid,
                info.get("node") or self.node,
                how,
            )
            with self._lock:
                self.named.append(
                    {
                        "rank": rank,
                        "node": info.get("node") or self.node,
                        "cause": lifecycle.cause_of(lifecycle.kind_of_exit(code)),
                        "kind": lifecycle.kind_of_exit(code),
                        "exit_code": code,
                    }
                )
            # Ranks that exit through gpuvigil (86, 89, 90, an exception) wrote their own
            # record; a signal or the health gate (before any Run) leaves none.
            if code < 0 or code in (87, 88):
                node = str(info.get("node") or self.node)
                self._record(
                    info,
                    lifecycle.ExitRecord(
                        time.time(),
                        lifecycle.kind_of_exit(code),
                        rank,
                        node,
                        code,
                        self._last_step(pid),
                        how,
                        by="monitor",
                    ),
                )

    def _last_step(self, pid: int) -> int:
        return next((b.step for b, _ in self.ranks() if b.pid == pid), 0)

    # --- acting ------------------------------------------------------------------------------
    def _record(self, info: dict[str, Any], rec: lifecycle.ExitRecord) -> None:
        where = info.get("checkpoint_dir") or self.config.checkpoint.dir
        if where:
            lifecycle.write_exit(open_storage(str(where)), rec)

    def _event(self, info: dict[str, Any], kind: Kind, data: dict[str, Any], *, node: str) -> None:
        path = info.get("events_file") or self.config.events_file
        if not path:
            return
        try:
            with EventWriter(Path(path)) as w:
                w.write(
                    Event(
                        ts=time.time(),
                        kind=kind,
                        source="training",
                        node=node,
                        job=info.get("job"),
                        data=data,
                    )
                )
        except OSError as e:
            log.warning("gpuvigil monitor: cannot write event to %s: %s", path, e)
