"""The agent's HTTP endpoints: /metrics, /healthz, /report.

Called by the agent, which starts it when `agent.sinks.http.enabled`. Scraped by
Prometheus (/metrics), probed by the kubelet or systemd (/healthz: 200 while the loop is
alive and has published recently, 503 otherwise, so a stuck agent is restarted), and
polled by people and tools (/report: the latest NodeReport as JSON; 503 before the first;
loopback clients only unless `report_clients: any`, since it carries kernel-log lines).
Stdlib server, one thread per request, bounded by a socket timeout.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import Field

from gpuvigil.core.config import StrictModel
from gpuvigil.core.findings import NodeReport

DEFAULT_LISTEN = "0.0.0.0:9410"


POLL_S = 5.0


class HttpConfig(StrictModel):
    enabled: bool = Field(True, description="Serve /metrics, /healthz and /report.")
    listen: str = Field(
        DEFAULT_LISTEN,
        description="HOST:PORT. All interfaces by default so Prometheus can scrape the node; "
        "port 0 picks a free one (tests). Nothing served here changes state.",
    )
    report_clients: Literal["local", "any"] = Field(
        "local",
        description="Who may read /report (the full NodeReport, kernel-log lines included): "
        "`local` answers only clients on the loopback address (on the node, or through "
        "`kubectl port-forward`), others get 403; `any` serves everyone who can reach the "
        "port. /metrics and /healthz are served to all.",
    )


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def _loopback(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


HealthFn = Callable[[], tuple[bool, dict[str, object]]]


class HttpSink:
    name = "http"

    def __init__(
        self, config: HttpConfig, *, registry: CollectorRegistry, health: HealthFn
    ) -> None:
        self._report: bytes | None = None
        sink = self
        local_only = config.report_clients == "local"

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a client that stops reading cannot hold a thread forever

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok, detail = health()
                    self._send(200 if ok else 503, json.dumps(detail).encode(), "application/json")
                elif path == "/report":
                    body = sink._report
                    if local_only and not _loopback(self.client_address[0]):
                        self._send(
                            403,
                            b'{"error": "/report is served on loopback only '
                            b'(agent.sinks.http.report_clients)"}',
                            "application/json",
                        )
                    elif body is None:
                        self._send(503, b'{"error": "no report yet"}', "application/json")
                    else:
                        self._send(200, body, "application/json")
                else:
                    self._send(404, b"not found: try /metrics, /healthz, /report\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every 15 s would drown the agent's own log

        host, port = parse_listen(config.listen)
        try:
            self.server = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:  # a taken port: one line and exit 2 (commands/agent.py)
            raise OSError(e.errno, f"cannot listen on {config.listen} (agent.sinks.http.listen, "
                          f"--listen): {e.strerror or e}") from None  # fmt: skip
        self.server.daemon_threads = True
        self.address = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
        # The accept loop wakes only for requests (and every POLL_S): at the default 0.5 s
        # it cost the idle agent more CPU than a whole check. close() wakes it at once.
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": POLL_S}, name="http",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def publish(self, report: NodeReport) -> None:
        self._report = report.model_dump_json(indent=1).encode()

    def close(self) -> None:
        stopper = threading.Thread(target=self.server.shutdown, daemon=True)
        stopper.start()
        host, port = self.server.server_address[:2]
        try:  # a connection wakes the accept loop now rather than at its next poll
            socket.create_connection((str(host), int(port)), timeout=1).close()
        except OSError:
            pass
        stopper.join(POLL_S + 1)
        self.server.server_close()
