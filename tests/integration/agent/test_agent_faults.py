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
XID79 = (
    "[ {t:.6f}] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus."
)


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
    b = start_agent(
        {"agent": {"kernel_log": {"source": "file", "file": str(a.machine.kmsg)}}},
        "--interval",
        str(INTERVAL),
    )
    assert ("kernel_log", "XID_79") in b.codes()


def test_adapter_port_down_and_gpu_lost_are_published_within_an_interval(start_agent):
    a = start_agent({}, "--interval", str(INTERVAL))
    wait_until(lambda: a.report()["status"] == "OK", 10, "a healthy node")
    t0 = time.monotonic()
    a.machine.sysfs.port_down("mlx5_2")
    wait_until(
        lambda: ("fabric", "FABRIC_PORT_DOWN") in a.codes(), INTERVAL + SLACK, "FABRIC_PORT_DOWN"
    )
    assert time.monotonic() - t0 <= INTERVAL + SLACK
    assert conditions(a)["NetworkFabricDegraded"]["status"] is True

    node = a.machine.nvml()
    node.gpu(5).lost = True
    a.machine.save_nvml(node)
    t0 = time.monotonic()
    wait_until(
        lambda: any(c == "gpu" and code in ("GPU_LOST", "GPU_COUNT_LOW") for c, code in a.codes()),
        INTERVAL + SLACK,
        "GPU_LOST",
    )
    assert time.monotonic() - t0 <= INTERVAL + SLACK
    gpu5 = [f for f in a.report()["findings"] if f["check"] == "gpu"]
    assert any(f["component"] == "gpu:5" for f in gpu5), gpu5


def test_nvml_xid_event_is_reconciled_with_the_kernel_log_line(start_agent):
    from gpuvigil.fakes.gpu import FakeXid

    a = start_agent({}, "--interval", str(INTERVAL))
    wait_until(lambda: a.report()["status"] == "OK", 10, "a healthy node")
    time.sleep(1.5)  # the `gpu` check registers NVML's event set on its first drain
    node = a.machine.nvml()
    node.gpu(3).xids.append(FakeXid(79))
    a.machine.save_nvml(node)
    # NVML alone: reported on gpu:3 (bus 5d) after the next `gpu` run.
    wait_until(lambda: ("kernel_log", "XID_79") in a.codes(), INTERVAL + SLACK, "XID_79 from NVML")
    (f,) = [f for f in a.report()["findings"] if f["code"] == "XID_79"]
    assert f["component"] == "gpu:3"
    # The same event in the kernel log is the same finding, not a second one.
    a.machine.log(
        "[ 3000.000000] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus."
    )
    time.sleep(2.0)
    xids = [f for f in a.report()["findings"] if f["code"] == "XID_79"]
    assert len(xids) == 1 and xids[0]["component"] == "gpu:3"
    assert "nvml" in json.dumps(xids[0]["evidence"])


def test_nvml_hang_is_check_timeout_while_other_checks_keep_publishing(start_agent):
    a = start_agent({"node": {"gpu": {"nvml_timeout_s": 1.5}}}, "--interval", str(INTERVAL))
    wait_until(lambda: a.report()["status"] == "OK", 10, "a healthy node")
    node = a.machine.nvml()
    node.gpu(6).hang = True
    a.machine.save_nvml(node)
    t0 = time.monotonic()
    wait_until(
        lambda: ("gpu", "CHECK_TIMEOUT") in a.codes(),
        INTERVAL + 1.5 + SLACK,
        "CHECK_TIMEOUT from the NVML worker",
    )
    assert time.monotonic() - t0 <= INTERVAL + 1.5 + SLACK

    def fabric_runs() -> float:
        for line in a.metrics().splitlines():
            if line.startswith('gpuvigil_check_runs_total{check="fabric",result="ok"}'):
                return float(line.split()[-1])
        return 0.0

    before = fabric_runs()
    time.sleep(3 * INTERVAL)
    assert fabric_runs() >= before + 2
    f = next(f for f in a.report()["findings"] if f["code"] == "CHECK_TIMEOUT")
    assert f["component"] == "gpu:6" and f["status"] == "FAILED"


def test_unreadable_kmsg_falls_back_to_dmesg_and_says_so(start_agent, fake_bin, tmp_path):
    out = tmp_path / "dmesg.out"
    out.write_text("[    1.000000] Linux version 6.1.0\n")
    fake_bin("dmesg", f"#!/bin/sh\ncat {out}\n")
    events = tmp_path / "events.jsonl"
    a = start_agent(
        {
            "agent": {
                "kernel_log": {
                    "source": "auto",
                    "file": None,
                    "kmsg_path": str(tmp_path / "no-kmsg"),
                },
                "events_file": str(events),
            }
        },
        "--interval",
        str(INTERVAL),
    )
    wait_until(lambda: ("kernel_log", "SOURCE_FALLBACK") in a.codes(), 5, "SOURCE_FALLBACK")
    f = next(f for f in a.report()["findings"] if f["code"] == "SOURCE_FALLBACK")
    assert f["status"] == "WARNING" and "no-kmsg" in f["message"]
    with out.open("a") as fh:
        fh.write(
            "[ 5000.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
            "name=<unknown>, GPU has fallen off the bus.\n"
        )
    wait_until(lambda: ("kernel_log", "XID_79") in a.codes(), 5, "XID_79 via dmesg")
    kinds = [json.loads(line) for line in events.read_text().splitlines()]
    assert any(e["kind"] == "finding.set" and e["data"]["code"] == "XID_79" for e in kinds)
