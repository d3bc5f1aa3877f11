"""Faults in the fake hardware while `gpuvigil agent` runs: an Xid line appended to the
kernel log, an adapter port going down, a GPU lost to NVML, an Xid already in the log
at start (the records since boot). Each must reach the state file, /report and /metrics
within one interval plus slack (the kernel log well under 2 s)."""

from __future__ import annotations

import json
import time

import agent_helpers
from agent_helpers import http_get, wait_until

start_agent = agent_helpers.start_agent  # the fixture
INTERVAL = 1.0
SLACK = 2.5
XID79 = ("[ {t:.6f}] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")


def conditions(a) -> dict[str, dict]:
    return {c["type"]: c for c in json.loads(http_get(a.url + "/report")[1])["conditions"]}


def test_xid_line_appended_reaches_every_sink_fast(start_agent):
    a = start_agent({}, "--interval", str(INTERVAL))
    wait_until(lambda: a.report()["status"] == "OK", 10, "a healthy node")
    t0 = time.monotonic()
    a.machine.log(XID79.format(t=1234.5))
    wait_until(lambda: ("kernel_log", "XID_79") in a.codes(), 2.0 + SLACK, "XID_79")
    latency = time.monotonic() - t0
    assert latency < 2.0 + SLACK, latency
    f = next(f for f in a.report()["findings"] if f["code"] == "XID_79")
    assert f["component"] == "gpu:0" and f["status"] == "FAILED"
    cond = conditions(a)["GPUXidError"]
    assert cond["status"] is True and cond["reason"] == "XID_79"
    metrics = a.metrics()
    assert 'gpuvigil_node_condition{condition="GPUXidError"} 1.0' in metrics
    assert 'gpuvigil_xid_events_total{code="79",gpu="0"} 1.0' in metrics


def test_xid_already_in_the_log_at_start_is_reported_from_the_first_report(start_agent):
    # The records since boot are read once at start: the first report already has it.
    a = start_agent({}, "--interval", str(INTERVAL), wait_ready=False)
    a.stop()
    a.machine.log(XID79.format(t=100.0))
    b = start_agent({"agent": {"kernel_log": {"source": "file",
                                              "file": str(a.machine.kmsg)}}},
                    "--interval", str(INTERVAL))
    assert ("kernel_log", "XID_79") in b.codes()


def test_adapter_port_down_and_gpu_lost_are_published_within_an_interval(start_agent):
    a = start_agent({}, "--interval", str(INTERVAL))
    wait_until(lambda: a.report()["status"] == "OK", 10, "a healthy node")
    t0 = time.monotonic()
    a.machine.sysfs.port_down("mlx5_2")
    wait_until(lambda: ("fabric", "FABRIC_PORT_DOWN") in a.codes(), INTERVAL + SLACK,
               "FABRIC_PORT_DOWN")
    assert time.monotonic() - t0 <= INTERVAL + SLACK
    assert conditions(a)["NetworkFabricDegraded"]["status"] is True

    node = a.machine.nvml()
    node.gpu(5).lost = True
    a.machine.save_nvml(node)
    t0 = time.monotonic()
    wait_until(lambda: any(c == "gpu" and code in ("GPU_LOST", "GPU_COUNT_LOW")
                           for c, code in a.codes()), INTERVAL + SLACK, "GPU_LOST")
    assert time.monotonic() - t0 <= INTERVAL + SLACK
    gpu5 = [f for f in a.report()["findings"] if f["check"] == "gpu"]
    assert any(f["component"] == "gpu:5" for f in gpu5), gpu5
