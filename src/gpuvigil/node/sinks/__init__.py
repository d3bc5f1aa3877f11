"""Where the agent publishes each NodeReport: Kubernetes, Slurm, HTTP, a state file.

Called by the agent. Every sink runs on a `SinkWorker` thread of its own holding only the
latest report, so a slow or failing sink (an API server that does not answer) never
delays the checks, the other sinks or the agent's loop; failures are retried with capped
exponential backoff, always with the newest report. A sink that keeps failing is the
agent's liveness problem (`Agent.health`: /healthz fails after `sink_failure_grace_s`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from gpuvigil.core.findings import NodeReport

log = logging.getLogger("gpuvigil.agent.sinks")


class Sink(Protocol):
    name: str

    def publish(self, report: NodeReport) -> None:
        """Publish one report; raise to have it retried with backoff."""

    def close(self) -> None: ...


class SinkWorker:
    def __init__(
        self,
        sink: Sink,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        on_success: Callable[[str], None] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.sink = sink
        self.backoff_initial_s, self.backoff_max_s = backoff_initial_s, backoff_max_s
        self._on_success, self._on_error = on_success, on_error
        self._cv = threading.Condition()
        self._latest: NodeReport | None = None
        self._stop = False
        self.last_success: float | None = None  # monotonic
        self.last_error: str | None = None
        self.published: NodeReport | None = None  # the latest report this sink took
        self.failing_since: float | None = None  # monotonic: first failure since a success
        self.thread = threading.Thread(target=self._loop, name=f"sink:{sink.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, report: NodeReport) -> None:
        with self._cv:
            self._latest = report
            self._cv.notify()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.thread.join(timeout_s)
        try:
            self.sink.close()
        except Exception as e:  # noqa: BLE001 - closing is best effort at shutdown
            log.warning("closing sink %s: %s", self.sink.name, e)

    def _loop(self) -> None:
        delay = self.backoff_initial_s
        while True:
            with self._cv:
                while self._latest is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                report, self._latest = self._latest, None
            try:
                self.sink.publish(report)
            except Exception as e:  # noqa: BLE001 - any sink failure is retried, never fatal
                self.last_error = f"{type(e).__name__}: {e}"
                self.failing_since = self.failing_since or time.monotonic()
                log.warning("sink %s failed (retry in %.1f s): %s", self.sink.name, delay, e)
                if self._on_error:
                    self._on_error(self.sink.name, e)
                with self._cv:
                    if self._latest is None:
                        self._latest = report  # retry this one unless a newer one came
                    self._cv.wait(delay)
                delay = min(delay * 2, self.backoff_max_s)
                continue
            delay = self.backoff_initial_s
            self.last_success, self.last_error = time.monotonic(), None
            self.published, self.failing_since = report, None
            if self._on_success:
                self._on_success(self.sink.name)
