"""The lab's alert path on its own (gpuvigil.lab.alerting): a real Prometheus scrapes a
target serving an agent's metrics with a fatal Xid, evaluates the shipped rules, and a real
Alertmanager delivers GpuvigilFatalXid to the lab's webhook; when the Xid clears, the
resolution is delivered too. Seconds, not the lab's minutes."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuvigil.lab.alerting import RULES_DEFAULT, AlertPath, missing
from testkit import require

pytestmark = pytest.mark.realparts


def serve_metrics(body: dict[str, str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def metrics(xid: int) -> str:
    return (
        'gpuvigil_agent_info{node="n1",version="0"} 1\n'
        f'gpuvigil_node_condition{{condition="GPUXidError"}} {xid}\n'
        "gpuvigil_agent_loop_last_timestamp_seconds " + f"{time.time():.0f}\n"
    )


def test_a_fatal_xid_is_delivered_and_then_resolved(tmp_path: Path) -> None:
    why = missing()
    require(not why, why)
    body = {"text": metrics(0)}
    agent = serve_metrics(body)
    path = AlertPath(tmp_path / "alerting", rules=RULES_DEFAULT)
    try:
        path.start(agents=[f"127.0.0.1:{agent.server_address[1]}"], controller="127.0.0.1:1")
        time.sleep(6)  # healthy first: nothing may fire from the agent's side
        path.poll(every_s=0)
        assert not [s for s in path.seen.values()
                    if s.labels["alertname"] == "GpuvigilFatalXid"]  # fmt: skip
        fault = time.time()
        body["text"] = metrics(1)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            path.poll(every_s=0.5)
            got = [e for e in path.take_view(fault) if e["name"] == "GpuvigilFatalXid"]
            if got and got[0]["delivered_after_s"] is not None:
                break
            time.sleep(0.5)
        [xid] = got
        assert xid["severity"] == "ticket" and xid["labels"]["node"] == "n1"
        assert xid["fired_after_s"] <= xid["delivered_after_s"] <= 30, xid
        body["text"] = metrics(0)
        end = time.monotonic() + 60
        while time.monotonic() < end and path.open_alerts():
            path.poll(every_s=0.5)
            time.sleep(0.5)
        [xid] = [e for e in path.take(fault) if e["name"] == "GpuvigilFatalXid"]
        assert (
            xid["resolved_after_s"] is not None
            and xid["resolved_after_s"] > xid["delivered_after_s"]
        )
    finally:
        path.stop()
        agent.shutdown()
