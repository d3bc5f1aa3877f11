"""The real servers the integration tests rely on start, answer and behave as documented."""

from __future__ import annotations

import threading
import time
from http.server import HTTPServer
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

from realparts.procs import free_port, wait_until


@pytest.mark.realparts
def test_kube_scheduler_keeps_pods_off_a_tainted_node(kube) -> None:
    kube.start_scheduler()
    tainted = kube.create_node(
        taints=[{"key": "gpuvigil.io/unhealthy", "value": "true", "effect": "NoSchedule"}]
    )
    ns = kube.namespace()
    # The scheduler sees the pod and reports it unschedulable because of the taint.
    why = kube.unschedulable_pod(ns, node_selector={"kubernetes.io/hostname": tainted})
    assert "taint" in why, why
    assert kube.core().read_namespaced_pod("p", ns).spec.node_name is None


@pytest.mark.realparts
def test_kube_node_status_patch_and_kubectl(kube) -> None:
    name = kube.create_node()
    kube.core().patch_node_status(
        name,
        {
            "status": {
                "conditions": [
                    {
                        "type": "GPUXidError",
                        "status": "True",
                        "reason": "XID_79",
                        "message": "gpu:3 XID_79",
                    }
                ]
            }
        },
    )
    conds = {c.type: c for c in kube.core().read_node(name).status.conditions}
    assert conds["GPUXidError"].reason == "XID_79"
    assert conds["Ready"].status == "True"
    r = kube.kubectl("get", "node", name, "-o", "name")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"node/{name}"


@pytest.mark.realparts
def test_slurm_drain_and_resume(slurm) -> None:
    node = slurm.names[1]
    slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=gpuvigil: test")
    assert "DRAIN" in slurm.node_state(node)
    slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    wait_until(lambda: slurm.node_state(node).startswith("IDLE"), timeout=20, what="idle")


@pytest.mark.realparts
def test_prometheus_scrapes_an_exporter(prometheus_factory) -> None:
    registry = CollectorRegistry()
    Gauge("gpuvigil_test_value", "a test gauge", registry=registry).set(42)

    class Quiet(WSGIRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

    port = free_port()
    httpd: HTTPServer = make_server("127.0.0.1", port, make_wsgi_app(registry), handler_class=Quiet)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        prom = prometheus_factory([f"127.0.0.1:{port}"])
        t0 = time.monotonic()
        result = prom.wait_for("gpuvigil_test_value", timeout=30)
        assert float(result[0]["value"][1]) == 42
        assert time.monotonic() - t0 < 30
    finally:
        httpd.shutdown()


@pytest.mark.realparts
def test_chromium_renders_and_reports_console_errors(chromium, tmp_path: Path) -> None:
    good = tmp_path / "good.html"
    good.write_text(
        "<html><body><h1 id=x>hi</h1>"
        "<script>document.getElementById('x').textContent='ok'</script></body></html>"
    )
    r = chromium.render(good, screenshot=tmp_path / "good.png")
    assert ">ok<" in r.dom and not r.errors
    assert r.screenshot is not None and r.screenshot.stat().st_size > 1000
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>undefinedFunction()</script></body></html>")
    assert chromium.render(bad).errors
