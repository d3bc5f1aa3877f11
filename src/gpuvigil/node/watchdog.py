"""The agent's self-watchdog: exit non-zero when the agent's own loop stops beating.

Called by the agent. A check can hang (that is the scheduler's problem), but the loop that
launches checks and publishes must never stop; if it does (a deadlock, a stuck sink call
on the loop thread, a bug), the only safe thing left is to exit so the supervisor (the
kubelet via the DaemonSet, or systemd's Restart=always) starts a fresh agent. A frozen
agent that keeps its HTTP port open would otherwise look alive while publishing nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from gpuvigil.core.cli_exit import CliExit

EXIT_STALLED = CliExit.STALLED  # `gpuvigil agent` exit status when the watchdog fires
log = logging.getLogger("gpuvigil.agent")


def exit_now(age_s: float) -> None:
    log.critical(
        "agent loop stalled for %.1f s: exiting with status %d so the supervisor "
        "restarts the agent",
        age_s,
        EXIT_STALLED,
    )
    logging.shutdown()
    os._exit(EXIT_STALLED)  # not sys.exit: a stalled process may never unwind


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        *,
        on_stall: Callable[[float], None] = exit_now,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s, self.on_stall, self.clock = timeout_s, on_stall, clock
        self._last = clock()
        self._stop = threading.Event()
        self.fired = False
        self.thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)

    def beat(self) -> None:
        self._last = self.clock()

    def age_s(self) -> float:
        return self.clock() - self._last

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        period = max(0.05, self.timeout_s / 4)
        while not self._stop.wait(period):
            age = self.age_s()
            if age > self.timeout_s and not self.fired:
                self.fired = True
                self.on_stall(age)
