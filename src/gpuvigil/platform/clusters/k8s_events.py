"""Kubernetes Events on nodes, sent by one background thread from a bounded queue.

As client-go's event recorder does: the controller's decisions do not wait for their
Events (a 2,000-node fault storm makes 2,000 of them), and when the queue is full the
newest are dropped and counted (`dropped`) rather than stalling a pass. Each Event is a
write like any other: the adapter's fence is asked first, so a replica that lost the lease
sends none of what it queued. Used by `clusters.kubernetes.KubernetesCluster.record_event`.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpuvigil.core.findings import utcnow
from gpuvigil.platform.clusters.base import ClusterError
from gpuvigil.platform.clusters.settings import KubernetesSettings

log = logging.getLogger("gpuvigil.clusters.kubernetes")


class EventRecorder:
    def __init__(
        self, core: Any, settings: KubernetesSettings, *, write: Callable[..., Any]
    ) -> None:
        self.core, self.ns, self._write = core, settings.event_namespace, write
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(settings.event_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def record(self, node: str, *, reason: str, message: str, warning: bool) -> None:
        now = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"name": f"{node}.{uuid.uuid4().hex[:12]}", "namespace": self.ns},
            "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1", "uid": node},
            "reason": reason[:128],
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "gpuvigil-controller"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.dropped += 1
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._send, name="events", daemon=True)
                self._thread.start()
                # a one-shot command (`gpuvigil release`) exits right after queueing: send
                # what is queued first (and never leave the thread inside a TLS read)
                atexit.register(self.flush)

    def _send(self) -> None:
        while True:
            body = self._queue.get()
            try:
                self._write(
                    "event",
                    lambda t, b=body: self.core.create_namespaced_event(
                        self.ns, b, _request_timeout=t
                    ),
                )
            except ClusterError as e:  # an Event is not worth a retry storm
                log.info("event for %s not sent: %s", body["involvedObject"]["name"], e)
            finally:
                self._queue.task_done()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the queued Events are sent or given up (tests, a clean exit)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks
