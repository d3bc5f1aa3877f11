"""/healthz fails on a stuck leader; /metrics serves the registry (real HTTP on loopback)."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry

from gpuvigil.platform import metrics as pmetrics
from gpuvigil.platform import serve


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_healthz_and_metrics() -> None:
    reg = CollectorRegistry()
    pmetrics.build(reg).nodes_total.set(7)
    state = {"last": 1000.0, "leader": True}
    app = serve.health_app(
        reg,
        last_pass=lambda: state["last"],
        is_leader=lambda: state["leader"],
        stale_after_s=120,
        clock=lambda: 1100.0,
    )
    server = serve.serve(app, port=0, host="127.0.0.1")
    try:
        port = server.server_port
        assert get(port, "/healthz") == (200, "ok\n")
        state["last"] = 900.0
        code, body = get(port, "/healthz")
        assert code == 503 and "200 s" in body
        state["leader"] = False  # a standby does not reconcile: it is not stuck
        assert get(port, "/healthz")[0] == 200
        code, body = get(port, "/metrics")
        assert code == 200 and "gpuvigil_nodes_total 7.0" in body
        # Counters exist at 0 before their first event, so increase() counts that event.
        assert 'gpuvigil_remediations_total{action="REBOOT",result="started"} 0.0' in body
        assert 'gpuvigil_remediations_total{action="DRAIN",result="succeeded"} 0.0' in body
        assert 'gpuvigil_controller_api_errors_total{kind="conflict"} 0.0' in body
    finally:
        server.shutdown()
        server.server_close()


def test_healthz_fails_on_a_stale_node_watch() -> None:
    age = {"s": 5.0}
    app = serve.health_app(
        CollectorRegistry(),
        last_pass=lambda: 1000.0,
        is_leader=lambda: True,
        stale_after_s=120,
        clock=lambda: 1000.0,
        watch_age=lambda: age["s"],
        watch_stale_s=180,
    )
    server = serve.serve(app, port=0, host="127.0.0.1")
    try:
        port = server.server_port
        assert get(port, "/healthz") == (200, "ok\n")
        age["s"] = 200.0  # a stalled watch is a blind controller
        code, body = get(port, "/healthz")
        assert code == 503 and "node watch heard nothing for 200 s" in body
    finally:
        server.shutdown()
        server.server_close()


def test_healthz_fails_when_the_node_watch_is_blind() -> None:
    why: dict[str, str | None] = {"s": None}
    app = serve.health_app(
        CollectorRegistry(), last_pass=lambda: 1000.0, is_leader=lambda: True,
        stale_after_s=120, clock=lambda: 1000.0, watch_blind=lambda: why["s"],
    )  # fmt: skip
    server = serve.serve(app, port=0, host="127.0.0.1")
    try:
        port = server.server_port
        assert get(port, "/healthz") == (200, "ok\n")
        why["s"] = "the node watch is refused: Forbidden: 403"
        assert get(port, "/healthz") == (503, "the node watch is refused: Forbidden: 403\n")
    finally:
        server.shutdown()
        server.server_close()
