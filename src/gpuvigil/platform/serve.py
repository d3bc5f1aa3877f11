"""The controller's HTTP endpoint: `/metrics` (Prometheus) and `/healthz` (liveness).

Started by `gpuvigil controller`. `/healthz` fails (503) when the reconcile loop has not
finished a pass for `stale_after_s` while this replica leads: a stuck loop (a hung API call
past its timeout, a deadlock) gets the pod restarted instead of silently stopping all
remediation. It also fails when the node watch (Kubernetes) has heard nothing for
`watch_stale_s`: a stalled watch is a blind controller (kopf #585, #957); and at once when
`watch_blind` says why the watch cannot see (the server refuses it, or it has failed to open
for two passes). A standby is healthy while its loop runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class _Threaded(WSGIServer):
    daemon_threads = True


def health_app(
    registry: CollectorRegistry,
    *,
    last_pass: Callable[[], float],
    is_leader: Callable[[], bool],
    stale_after_s: float,
    clock: Callable[[], float] = time.time,
    watch_age: Callable[[], float] | None = None,
    watch_stale_s: float = 0.0,
    watch_blind: Callable[[], str | None] | None = None,
) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start)
        age = clock() - last_pass()
        if is_leader() and age > stale_after_s:
            start("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"no reconcile pass for {age:.0f} s\n".encode()]
        heard = watch_age() if watch_age is not None else 0.0
        if watch_stale_s and heard > watch_stale_s:
            start("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"the node watch heard nothing for {heard:.0f} s\n".encode()]
        blind = watch_blind() if watch_blind is not None else None
        if blind:
            start("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"{blind}\n".encode()]
        start("200 OK", [("Content-Type", "text/plain")])
        return [b"ok\n"]

    return app


def serve(app: Callable[..., Iterable[bytes]], *, port: int, host: str = "") -> WSGIServer:
    """Serve `app` on a daemon thread; returns the server (call shutdown() to stop)."""
    server = make_server(host, port, app, server_class=_Threaded, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
